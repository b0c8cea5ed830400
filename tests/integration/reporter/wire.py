"""A pyqwest transport between the real GiteaClient and the Gitea double that records every
RunnerService request and can misbehave like a flaky network or proxy on chosen calls.

Faults, chosen per call by a `Policy`:
- ``"refuse"``: answer 503 without forwarding (a proxy with no upstream);
- ``"drop"``: forward, let the double handle it, then answer 502 (the answer got lost);
- ``("truncate", n)``: forward an UpdateLog with only its first `n` rows (rows lost on the
  way), so the double's real answer acknowledges fewer rows than were sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pyqwest

from dynrunner.proto._gen.runner.v1 import messages_pb2 as pb

_REQUESTS = {"UpdateLog": pb.UpdateLogRequest, "UpdateTask": pb.UpdateTaskRequest}
_RESPONSES = {"UpdateLog": pb.UpdateLogResponse, "UpdateTask": pb.UpdateTaskResponse}

Fault = str | tuple[str, int] | None
Policy = Callable[["Exchange"], Fault]


@dataclass
class Exchange:
    """One RunnerService call as it crossed the wire."""

    method: str
    request: Any  # the decoded request message (None for other methods)
    fault: Fault = None
    status: int = 0
    response: Any = None  # the decoded response, when the double answered 200

    @property
    def rows(self) -> list[str]:
        return [r.content for r in self.request.rows] if self.method == "UpdateLog" else []


class FaultyWire:
    def __init__(self, policy: Policy | None = None) -> None:
        self._inner = pyqwest.HTTPTransport()
        self.policy: Policy = policy or (lambda _: None)
        self.exchanges: list[Exchange] = []

    def calls(self, method: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == method]

    async def execute(self, request: pyqwest.Request) -> pyqwest.Response:
        method = request.url.rsplit("/", 1)[-1]
        body = await _read(request.content)
        message_type = _REQUESTS.get(method)
        message = message_type.FromString(body) if message_type else None
        exchange = Exchange(method, message)
        self.exchanges.append(exchange)
        exchange.fault = fault = self.policy(exchange) if message is not None else None
        if fault == "refuse":
            exchange.status = 503
            return _error(503, "unavailable", "upstream connect error")
        if isinstance(fault, tuple) and fault[0] == "truncate":
            cut = pb.UpdateLogRequest()
            cut.CopyFrom(message)
            del cut.rows[fault[1] :]
            body = cut.SerializeToString()
        headers = pyqwest.Headers([(k, v) for k, v in request.headers.items() if k.lower() != "content-length"])
        response = await self._inner.execute(pyqwest.Request(request.method, request.url, headers, body))
        content = await _read(response.content)
        exchange.status = response.status
        if response.status == 200 and method in _RESPONSES:
            exchange.response = _RESPONSES[method].FromString(content)
        if fault == "drop":
            exchange.status = 502
            return _error(502, "unavailable", "bad gateway: upstream reset")
        return pyqwest.Response(status=response.status, headers=response.headers, content=content)


async def _read(content: bytes | AsyncIterator[Any] | None) -> bytes:
    if content is None:
        return b""
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content)
    return b"".join([bytes(chunk) async for chunk in content])


def _error(status: int, code: str, message: str) -> pyqwest.Response:
    body = ('{"code": "%s", "message": "%s"}' % (code, message)).encode()  # noqa: UP031
    return pyqwest.Response(status=status, headers=pyqwest.Headers({"content-type": "application/json"}), content=body)
