"""ASGI plumbing the double's endpoints share (the app, git, artifacts, the admin API): the
ASGI types, and for the plain HTTP endpoints request bodies, headers and query strings in,
Go-style `http.Error` text and JSON out."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

Headers = list[tuple[bytes, bytes]]


class HTTPError(Exception):
    """`ctx.HTTPError(status, text)`: Go's `http.Error`, the text plus a newline."""

    def __init__(self, status: int, text: str = "", headers: Headers | None = None) -> None:
        super().__init__(text)
        self.status = status
        self.text = text or _STATUS_TEXT.get(status, "")
        self.headers = headers or []


_STATUS_TEXT = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error"}


def headers_of(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def query_of(scope: Scope) -> dict[str, str]:
    """First value of each query parameter (Go's `URL.Query().Get`)."""
    parsed = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return {key: values[0] for key, values in parsed.items()}


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def respond(send: Send, status: int, content_type: str, body: bytes, headers: Headers | None = None) -> None:
    start = [(b"content-type", content_type.encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


async def plain(send: Send, status: int, text: str, headers: Headers | None = None) -> None:
    await respond(send, status, "text/plain; charset=utf-8", text.encode(), headers)


async def http_error(send: Send, error: HTTPError) -> None:
    await plain(send, error.status, f"{error.text}\n", [(b"x-content-type-options", b"nosniff"), *error.headers])


async def json_response(send: Send, status: int, value: Any) -> None:
    """`ctx.JSON`: Go's encoder, compact."""
    await respond(send, status, "application/json;charset=utf-8", json.dumps(value, separators=(",", ":")).encode())
