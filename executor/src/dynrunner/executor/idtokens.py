"""OIDC ID tokens for a job's steps: JWT-SVIDs of the job's SPIFFE identity, served the way
`@actions/core`'s `getIDToken(audience)` asks for them.

Released Gitea (1.24-1.26) issues no ID tokens, so the executor answers the request itself. For
a job that grants `id-token: write` and has a workload identity, it listens on loopback (an
ephemeral port of the job's own environment) and sets

* `ACTIONS_ID_TOKEN_REQUEST_URL` = `http://127.0.0.1:<port>/_dynrunner/idtoken?api-version=2.0`
  (it has a query already, because the toolkit appends `&audience=<audience>`);
* `ACTIONS_ID_TOKEN_REQUEST_TOKEN` = a random bearer made for this job alone, masked in the log.

`GET <url>&audience=X` with `Authorization: Bearer <token>` answers `{"value": "<JWT-SVID>"}`:
the token the Workload API issues to this job for audience X, whose `sub` is the job's SPIFFE ID
(checked before it is handed out). Every issued token is masked in the log from then on, whatever
the step does with it. Errors are JSON `{"message": ...}` with 400 (no or bad audience), 401
(no or wrong bearer), 404/405 (another path or method) and 502 (the Workload API refused).

Which jobs get the variables (`grant_of`): as on GitHub, the job's `permissions:` replace the
workflow's; `id-token: write` or `write-all` grants; no `permissions:` block anywhere grants
nothing (GitHub's default token permissions never include `id-token`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from dynrunner.proto.assignment import Assignment, IdentityWait

PATH = "/_dynrunner/idtoken"
MAX_REQUEST_BYTES = 16 * 1024
MAX_AUDIENCE = 1000
READ_TIMEOUT_S = 10.0
FETCH_TIMEOUT_S = 10.0
URL_ENV = "ACTIONS_ID_TOKEN_REQUEST_URL"
TOKEN_ENV = "ACTIONS_ID_TOKEN_REQUEST_TOKEN"


@dataclass(frozen=True, slots=True)
class Grant:
    """Whether the job may request ID tokens, and the sentence that says why (for the log)."""

    granted: bool
    reason: str


def grant_of(workflow_permissions: Any, job_permissions: Any) -> Grant:
    """GitHub's rule: the job's `permissions:` (when given) replace the workflow's; the
    `id-token` scope must be `write`, or everything granted with `write-all`."""
    if job_permissions is not None:
        where, permissions = "the job's `permissions:`", job_permissions
    elif workflow_permissions is not None:
        where, permissions = "the workflow's `permissions:`", workflow_permissions
    else:
        return Grant(False, "the workflow sets no `permissions:`, and ID tokens need `permissions: id-token: write`")
    if permissions == "write-all":
        return Grant(True, f"{where} grant write-all")
    if isinstance(permissions, Mapping):
        scope = permissions.get("id-token")
        if scope == "write":
            return Grant(True, f"{where} grant id-token: write")
        shown = "not granted" if scope is None else f"{scope}"
        return Grant(False, f"{where} set id-token: {shown} (ID tokens need id-token: write)")
    return Grant(False, f"{where} are {permissions!r}, which does not grant id-token: write")


class IdTokenError(Exception):
    """The Workload API issued no usable JWT-SVID; the message is for the step."""


def fetch_jwt_svid(endpoint: str, spiffe_id: str, audience: str, timeout_s: float) -> str:
    """The job's JWT-SVID for `audience` from the Workload API (blocking; py-spiffe)."""
    from spiffe import SpiffeId, WorkloadApiClient  # grpc loads only when a token is asked for

    client = WorkloadApiClient(socket_path=endpoint)
    try:
        svid = client.fetch_jwt_svid({audience}, subject=SpiffeId(spiffe_id), timeout=timeout_s)
    except Exception as err:
        raise IdTokenError(str(err) or type(err).__name__) from None
    finally:
        client.close()
    if str(svid.spiffe_id) != spiffe_id:
        raise IdTokenError(f"the Workload API answered with a token for {svid.spiffe_id}, not for {spiffe_id}")
    return str(svid.token)


Fetch = Callable[[str, str, str, float], str]


@dataclass(slots=True)
class Counts:
    issued: int = 0
    refused: int = 0


class IdTokenEndpoint:
    """The loopback endpoint of one job. `add_mask` is called with each value to hide (the
    bearer at once, each token before it leaves); `log` gets one line per token issued."""

    def __init__(
        self,
        spiffe_id: str,
        workload_api: str,
        add_mask: Callable[[str], None],
        log: Callable[[str], None],
        *,
        fetch: Fetch = fetch_jwt_svid,
        host: str = "127.0.0.1",
    ) -> None:
        self.spiffe_id = spiffe_id
        self.workload_api = workload_api
        self.bearer = secrets.token_urlsafe(32)
        self.counts = Counts()
        self._add_mask = add_mask
        self._log = log
        self._fetch = fetch
        self._host = host
        self._server: asyncio.Server | None = None
        self._port = 0
        add_mask(self.bearer)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, 0, limit=MAX_REQUEST_BYTES)
        self._port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}{PATH}?api-version=2.0"

    def env(self) -> dict[str, str]:
        return {URL_ENV: self.url, TOKEN_ENV: self.bearer}

    # --- one request per connection ----------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
                return
            status, body = await self._answer(head.decode("latin-1"))
            if status != 200:
                self.counts.refused += 1
            data = json.dumps(body).encode()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _answer(self, head: str) -> tuple[int, dict[str, str]]:
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return 400, _message("not an HTTP request")
        method, target, _ = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        url = urlsplit(target)
        if url.path != PATH:
            return 404, _message(f"no such endpoint {url.path}; ID tokens are served at {PATH}")
        if method != "GET":
            return 405, _message(f"{method} is not allowed; ask for an ID token with GET")
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            return 401, _message(f"the request has no `Authorization: Bearer` with this job's {TOKEN_ENV}")
        if not hmac.compare_digest(given.encode(), self.bearer.encode()):
            return 401, _message(f"the bearer is not this job's {TOKEN_ENV}")
        audiences = parse_qs(url.query, keep_blank_values=True).get("audience", [])
        if len(audiences) != 1 or not audiences[0]:
            return 400, _message(
                "the request names no audience (or more than one): call getIDToken(<audience>), e.g. "
                "getIDToken('sts.amazonaws.com'); a JWT-SVID is always issued for an audience"
            )
        audience = audiences[0]
        if len(audience) > MAX_AUDIENCE or any(ord(c) < 0x20 or ord(c) == 0x7F for c in audience):
            return 400, _message(f"the audience must be at most {MAX_AUDIENCE} printable characters")
        try:
            token = await asyncio.to_thread(self._fetch, self.workload_api, self.spiffe_id, audience, FETCH_TIMEOUT_S)
        except IdTokenError as err:
            what = f"the Workload API issued no JWT-SVID for {self.spiffe_id} (audience {audience!r})"
            return 502, _message(f"{what}: {err}")
        self._add_mask(token)
        self.counts.issued += 1
        self._log(f"Issued an OIDC ID token (JWT-SVID for {self.spiffe_id}) for audience {audience!r}{_expiry(token)}")
        return 200, {"value": token}


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    502: "Bad Gateway",
}


def _message(text: str) -> dict[str, str]:
    return {"message": text}


def _expiry(token: str) -> str:
    """`, valid for Ns` from the token's own `exp` (unverified: it is ours), or nothing."""
    import base64

    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return f", valid for {max(0, int(claims['exp'] - time.time()))}s"
    except (IndexError, ValueError, KeyError, TypeError):
        return ""


def workload_api_env(identity: IdentityWait) -> dict[str, str]:
    """SPIFFE_ENDPOINT_SOCKET for the steps of a job with an identity, so SPIFFE-aware tools
    (and `dynrunner-identity`) find the Workload API also where only the assignment names it
    (a VM); a backend that set it for the executor has it inherited anyway."""
    if not identity.enabled:
        return {}
    from dynrunner.executor.identity import SPIFFE_ENDPOINT_ENV, workload_api_endpoint  # jobs with an identity only

    endpoint = workload_api_endpoint(identity.workload_api_socket)
    return {SPIFFE_ENDPOINT_ENV: endpoint} if endpoint else {}


async def open_id_tokens(
    assignment: Assignment, grant: Grant, add_mask: Callable[[str], None], log: Callable[[str], None]
) -> IdTokenEndpoint | None:
    """The job's started endpoint when it `grant`s ID tokens and has a workload identity;
    otherwise None, with a log line saying why when it matters (`##[warning]` when the job
    asked for tokens it cannot have)."""
    identity = assignment.executor.identity
    if not identity.enabled or not assignment.spiffe_id:
        if grant.granted:
            log(
                f"##[warning]OIDC ID tokens are not available: {grant.reason}, but pool {assignment.pool or '-'} "
                "issues no workload identity to its jobs, so ACTIONS_ID_TOKEN_REQUEST_URL is not set."
            )
        return None
    if not grant.granted:
        log(f"OIDC ID tokens: off ({grant.reason})")
        return None
    endpoint = workload_api_env(identity).get("SPIFFE_ENDPOINT_SOCKET", "")
    if not endpoint:
        log("##[warning]OIDC ID tokens are not available: no Workload API socket is known to the executor.")
        return None
    id_tokens = IdTokenEndpoint(assignment.spiffe_id, endpoint, add_mask, log)
    try:
        await id_tokens.start()
    except OSError as err:
        log(f"##[warning]OIDC ID tokens are not available: the executor cannot listen on loopback ({err}).")
        return None
    log(f"OIDC ID tokens: on ({grant.reason}); subject {assignment.spiffe_id}")
    return id_tokens
