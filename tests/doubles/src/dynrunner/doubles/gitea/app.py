"""The ASGI application: Gitea's Connect handlers under `/api/actions`, the admin API under
`/_double/`, git's smart HTTP under `/{owner}/{repo}[.git]/`, the artifact APIs (v3 under
`/api/actions_pipeline`, v4 under `/twirp/github.actions.results.api.v1.ArtifactService`),
everything else 404.

Like Gitea's `connect.WithCompressMinBytes(1024)` on the RunnerService handler, its
responses shorter than 1024 bytes are sent uncompressed (without a Content-Encoding
header) even when the client accepts gzip. The PingService handler has no such option:
it compresses every response the client accepts gzip for.
"""

from __future__ import annotations

import gzip
from typing import Any

from dynrunner.doubles.gitea.artifacts_v3 import ROUTE as ARTIFACTS_V3_ROUTE
from dynrunner.doubles.gitea.artifacts_v4 import ROUTE as ARTIFACTS_V4_ROUTE
from dynrunner.doubles.gitea.githttp import ROUTE as GIT_ROUTE
from dynrunner.doubles.gitea.httpio import ASGIApp, Message, Receive, Scope, Send
from dynrunner.proto._gen.ping.v1.services_connect import PingServiceASGIApplication
from dynrunner.proto._gen.runner.v1.services_connect import RunnerServiceASGIApplication

PREFIX = "/api/actions"
COMPRESS_MIN_BYTES = 1024


def _compress_min_bytes(app: ASGIApp) -> ASGIApp:
    """Undo gzip on small unary responses (connect-go's compress-min-bytes)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None

        async def send_small_plain(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                if headers.get(b"content-encoding") == b"gzip":
                    start = message
                    return
            elif message["type"] == "http.response.body" and start is not None and not message.get("more_body"):
                body = message.get("body", b"")
                plain = gzip.decompress(body)
                if len(plain) < COMPRESS_MIN_BYTES:
                    start["headers"] = [(k, v) for k, v in start["headers"] if k != b"content-encoding"]
                    message = {**message, "body": plain}
                await send(start)
                start = None
            await send(message)

        await app(scope, receive, send_small_plain)

    return wrapped


def build_app(
    runner_service: Any, ping_service: Any, admin: ASGIApp, git: ASGIApp, artifacts_v3: ASGIApp, artifacts_v4: ASGIApp
) -> ASGIApp:
    runner_app = _compress_min_bytes(RunnerServiceASGIApplication(runner_service))
    ping_app = PingServiceASGIApplication(ping_service)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if ARTIFACTS_V3_ROUTE.match(path):
            await artifacts_v3(scope, receive, send)
            return
        if ARTIFACTS_V4_ROUTE.match(path):
            await artifacts_v4(scope, receive, send)
            return
        if path.startswith(PREFIX + "/"):
            inner = {**scope, "path": path[len(PREFIX) :], "root_path": scope.get("root_path", "") + PREFIX}
            if inner["path"].startswith("/runner.v1.RunnerService/"):
                await runner_app(inner, receive, send)
                return
            if inner["path"].startswith("/ping.v1.PingService/"):
                await ping_app(inner, receive, send)
                return
        elif path.startswith("/_double/") or path == "/_double":
            await admin(scope, receive, send)
            return
        elif GIT_ROUTE.match(path):
            await git(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"404 page not found\n"})

    return app
