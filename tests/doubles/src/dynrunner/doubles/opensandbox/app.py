"""The HTTP surface: opensandbox-server 1.1.1's lifecycle routes (`api/lifecycle.py`,
`main.py`, `middleware/auth.py`), on FastAPI like the server, so a body the contract rejects
gets FastAPI's 422 `{"detail": [...]}` and every other error the `{code, message}` envelope.

Every route is served at the root and under `/v1`, as the server mounts them. Auth is the
single-tenant `OPEN-SANDBOX-API-KEY` header (401 MISSING_API_KEY / INVALID_API_KEY), with the
server's exemptions: `/health`, `/version`, the docs, and the sandbox proxy route. execd is
served behind that proxy route (`/sandboxes/{id}/proxy/44772/...`), which is also the endpoint
the double publishes for port 44772, with or without `use_server_proxy`. So, as upstream, the
sandbox's id alone reaches its execd — unless the sandbox was made with `secureAccess` (a
`gateway` double): then its endpoints carry a per-sandbox `OpenSandbox-Secure-Access` token and
the proxy route refuses a caller without it (401 MISSING_OR_INVALID_SECURE_ACCESS, `api/proxy.py`).
"""

from __future__ import annotations

import hmac
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from dynrunner.doubles.opensandbox import execd
from dynrunner.doubles.opensandbox.errors import ApiError
from dynrunner.doubles.opensandbox.sandboxes import Sandboxes
from dynrunner.doubles.opensandbox.schema import CreateSandboxRequest, Endpoint, RenewRequest

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
SECURE_ACCESS_HEADER = "OpenSandbox-Secure-Access"
LOG_SCOPES = ("container", "all")
CONSOLE_LINES = 100
EXECD_PORT = 44772
_EXEMPT = ("/health", "/version", "/docs", "/redoc", "/openapi.json")
_PROXY_PATH = re.compile(r"^(/v1)?/sandboxes/[^/]+/proxy/\d+(/|$)")


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(status_code=err.status, content={"code": err.code, "message": err.message})


def _lifecycle(sandboxes: Sandboxes) -> APIRouter:
    router = APIRouter()

    @router.post("/sandboxes", status_code=202)
    async def create(request: CreateSandboxRequest) -> Response:
        box = await sandboxes.create(request)
        return _json(202, sandboxes.view(box, with_image=False))

    @router.get("/sandboxes")
    async def list_sandboxes(
        state: Annotated[list[str] | None, Query()] = None,
        metadata: Annotated[str | None, Query()] = None,
        page: Annotated[int, Query(ge=1)] = 1,
        page_size: Annotated[int, Query(ge=1, le=200, alias="pageSize")] = 20,
    ) -> Response:
        wanted: dict[str, str] = {}
        if metadata:
            try:
                wanted = dict(parse_qsl(metadata, keep_blank_values=True, strict_parsing=True))
            except ValueError as err:
                raise ApiError(400, "INVALID_METADATA_FORMAT", f"Invalid metadata format: {err}") from err
        return _json(200, sandboxes.query(state, wanted, page, page_size))

    @router.get("/sandboxes/{sandbox_id}")
    async def get(sandbox_id: str) -> Response:
        return _json(200, sandboxes.view(sandboxes.get(sandbox_id)))

    @router.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def delete(sandbox_id: str) -> Response:
        await sandboxes.delete(sandbox_id)
        return Response(status_code=204)

    @router.patch("/sandboxes/{sandbox_id}/metadata")
    async def patch_metadata(sandbox_id: str, patch: Annotated[dict[str, str | None], Body()]) -> Response:
        return _json(200, sandboxes.view(sandboxes.patch_metadata(sandbox_id, patch)))

    @router.post("/sandboxes/{sandbox_id}/pause", status_code=202)
    async def pause(sandbox_id: str) -> Response:
        sandboxes.pause(sandbox_id)
        return Response(status_code=202)

    @router.post("/sandboxes/{sandbox_id}/resume", status_code=202)
    async def resume(sandbox_id: str) -> Response:
        sandboxes.resume(sandbox_id)
        return Response(status_code=202)

    @router.post("/sandboxes/{sandbox_id}/renew-expiration")
    async def renew(sandbox_id: str, request: RenewRequest) -> Response:
        when: datetime = sandboxes.renew(sandbox_id, request.expires_at)
        return JSONResponse({"expiresAt": when.isoformat().replace("+00:00", "Z")})

    @router.get("/sandboxes/{sandbox_id}/endpoints/{port}")
    async def endpoint(
        request: Request, sandbox_id: str, port: int, use_server_proxy: bool = False, expires: int | None = None
    ) -> Response:
        if use_server_proxy and expires is not None:
            raise ApiError(400, "SANDBOX::INVALID_PARAMETER", "use_server_proxy cannot be combined with expires.")
        if expires is not None:
            raise ApiError(400, "SANDBOX::API_NOT_SUPPORTED", "Signed routes (expires parameter) are not supported.")
        box = sandboxes.endpoint_ready(sandbox_id, port)
        prefix = request.url.path.split("/sandboxes/", 1)[0]
        base = f"{request.url.netloc}{prefix}"
        headers = {SECURE_ACCESS_HEADER: box.access_token} if box.access_token else None
        return _json(200, Endpoint(endpoint=f"{base}/sandboxes/{sandbox_id}/proxy/{port}", headers=headers))

    @router.get("/sandboxes/{sandbox_id}/diagnostics/logs")
    async def console(sandbox_id: str, scope: str | None = None) -> Response:
        """The stable descriptor (`api/devops.py`): the last 100 lines of the console, inline."""
        box = sandboxes.get(sandbox_id)
        if scope is None or scope.strip().lower() not in LOG_SCOPES:
            raise ApiError(
                400,
                "DIAGNOSTICS_SCOPE_UNSUPPORTED",
                f"Unsupported logs diagnostics scope '{scope}'. Supported scopes: {', '.join(LOG_SCOPES)}.",
            )
        text = box.console.read_text(errors="replace") if box.console.exists() else ""
        lines = text.splitlines(keepends=True)
        content = "".join(lines[-CONSOLE_LINES:])
        return JSONResponse(
            {
                "sandboxId": sandbox_id,
                "kind": "logs",
                "scope": scope.strip().lower(),
                "delivery": "inline",
                "contentType": "text/plain; charset=utf-8",
                "content": content,
                "contentLength": len(content.encode()),
                "truncated": len(lines) > CONSOLE_LINES,
            }
        )

    @router.post("/metrics/events", status_code=204)
    async def metrics_event() -> Response:
        return Response(status_code=204)

    return router


def _json(status: int, model: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content=model.model_dump(mode="json", by_alias=True, exclude_none=True))


def _execd_target(sandboxes: Sandboxes) -> Callable[[Request], Any]:
    """The sandbox whose execd a proxied request reaches; raises the proxy's errors (404 for
    an unknown sandbox, 502 when nothing answers on that port)."""

    def sandbox_of(request: Request) -> Any:
        sandbox_id = request.path_params["sandbox_id"]
        box = sandboxes.get(sandbox_id)
        given = request.headers.get(SECURE_ACCESS_HEADER, "")
        if box.access_token and not hmac.compare_digest(given.encode(), box.access_token.encode()):
            raise ApiError(
                401,
                "MISSING_OR_INVALID_SECURE_ACCESS",
                f"This sandbox requires the {SECURE_ACCESS_HEADER} header for access.",
            )
        if int(request.path_params["port"]) != EXECD_PORT or box.state != "Running":
            raise ApiError(502, "BACKEND_CONNECTION_FAILED", f"Failed to connect to sandbox {sandbox_id}.")
        return box

    return sandbox_of


def request_kind(method: str, path: str) -> str:
    """`GET /sandboxes/{id}`, `execd POST /files/upload`: what `OpenSandboxDouble.requests` counts."""
    path = path.removeprefix("/v1")
    proxied = _PROXY_PATH.match(path)
    if proxied:
        return f"execd {method} /{path[proxied.end() :]}"
    return f"{method} " + re.sub(r"^/sandboxes/[^/]+", "/sandboxes/{id}", path)


def build_app(sandboxes: Sandboxes, api_key: str | None, requests: Counter[str] | None = None) -> FastAPI:
    app = FastAPI(title="OpenSandbox Lifecycle API (double)", version="0.1.0")
    counted: Counter[str] = Counter() if requests is None else requests

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return _error(err)

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        counted[request_kind(request.method, path)] += 1
        if api_key and not path.startswith(_EXEMPT) and not (".." not in path and _PROXY_PATH.match(path)):
            given = request.headers.get(API_KEY_HEADER)
            if not given:
                return JSONResponse(
                    status_code=401,
                    content={"code": "MISSING_API_KEY", "message": f"Provide API key via {API_KEY_HEADER} header."},
                )
            if given != api_key:
                return JSONResponse(
                    status_code=401,
                    content={"code": "INVALID_API_KEY", "message": "Authentication credentials are invalid."},
                )
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": "1.1.1"}

    lifecycle = _lifecycle(sandboxes)
    execd_router = execd.build_router(_execd_target(sandboxes))
    for prefix in ("", "/v1"):
        app.include_router(lifecycle, prefix=prefix)
        app.include_router(execd_router, prefix=f"{prefix}/sandboxes/{{sandbox_id}}/proxy/{{port}}")
    return app
