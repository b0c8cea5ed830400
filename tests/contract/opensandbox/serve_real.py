"""Serve the real opensandbox-server 1.1.1 app with the double's sandbox engine as its runtime.

Run as a script (the server configures logging and starts threads at import, so it gets a
process of its own): `python serve_real.py STATE_DIR`; prints `{"url": ..., "api_key": ...}`
once it accepts connections. Everything above the runtime is the real server's: routes,
request models and their 422s, the auth middleware, the `{code, message}` envelope, the
service-layer validators (`ensure_entrypoint`, `ensure_metadata_labels`,
`ensure_timeout_within_limit`) and the response models our answers must fit.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

API_KEY = "contract-key"
SLEEPER = "registry.test/sleeper:1"
"""The one image this runtime boots (`sleep` as its entrypoint): for what needs a running sandbox."""
CONFIG = """
[server]
host = "127.0.0.1"
api_key = "{key}"
max_sandbox_timeout_seconds = 86400

[runtime]
type = "docker"
execd_image = "opensandbox/execd:v1.1.0"

[store]
type = "sqlite"
path = "{state}/store.db"
"""


def _runtime(engine: Any) -> Any:
    import anyio.from_thread
    from fastapi import HTTPException
    from opensandbox_server.api import schema
    from opensandbox_server.services import validators
    from opensandbox_server.services.sandbox_service import SandboxService

    from dynrunner.doubles.opensandbox.errors import ApiError
    from dynrunner.doubles.opensandbox.schema import CreateSandboxRequest

    def call(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ApiError as err:
            raise HTTPException(err.status, {"code": err.code, "message": err.message}) from err

    def as_sandbox(box: Any) -> Any:
        return schema.Sandbox.model_validate(engine.view(box).model_dump(mode="json", by_alias=True, exclude_none=True))

    class DoubleRuntime(SandboxService):
        docker_client = object()  # the snapshot service insists on one; snapshots are never used

        async def create_sandbox(self, request: Any) -> Any:
            validators.ensure_entrypoint(request.entrypoint or [])
            validators.ensure_metadata_labels(request.metadata)
            validators.ensure_timeout_within_limit(request.timeout, 86400)
            ours = CreateSandboxRequest.model_validate(
                request.model_dump(mode="json", by_alias=True, exclude_none=True)
            )
            try:
                box = await engine.create(ours)
            except ApiError as err:
                raise HTTPException(err.status, {"code": err.code, "message": err.message}) from err
            view = engine.view(box, with_image=False).model_dump(mode="json", by_alias=True, exclude_none=True)
            return schema.CreateSandboxResponse.model_validate(view)

        def list_sandboxes(self, request: Any) -> Any:
            f, p = request.filter, request.pagination
            answer = engine.query(f.state, f.metadata or {}, p.page, p.page_size)
            return schema.ListSandboxesResponse.model_validate(
                answer.model_dump(mode="json", by_alias=True, exclude_none=True)
            )

        def get_sandbox(self, sandbox_id: str) -> Any:
            return as_sandbox(call(engine.get, sandbox_id))

        def delete_sandbox(self, sandbox_id: str) -> None:
            call(lambda: anyio.from_thread.run(engine.delete, sandbox_id))

        def pause_sandbox(self, sandbox_id: str) -> None:
            call(engine.pause, sandbox_id)

        def resume_sandbox(self, sandbox_id: str) -> None:
            call(engine.resume, sandbox_id)

        def renew_expiration(self, sandbox_id: str, request: Any) -> Any:
            when = call(engine.renew, sandbox_id, request.expires_at)
            return schema.RenewSandboxExpirationResponse(expiresAt=when)

        def patch_sandbox_metadata(self, sandbox_id: str, patch: Any) -> Any:
            return as_sandbox(call(engine.patch_metadata, sandbox_id, patch))

        def get_endpoint(self, sandbox_id: str, port: int, *_: Any, **__: Any) -> Any:
            box = call(engine.endpoint_ready, sandbox_id, port)
            # As the Kubernetes runtime answers for a sandbox made with secureAccess: its token
            # in the endpoint's headers, which the server's own proxy route then demands.
            headers = {"OpenSandbox-Secure-Access": box.access_token} if box.access_token else None
            return schema.Endpoint(endpoint=f"127.0.0.1:44772/proxy/{port}", headers=headers)

        def _unsupported(self, *_: Any, **__: Any) -> Any:
            raise HTTPException(501, {"code": "SANDBOX::API_NOT_SUPPORTED", "message": "not in the contract tier"})

        def get_sandbox_log_diagnostics(self, sandbox_id: str, scope: str) -> Any:
            from opensandbox_server.services.diagnostics import DiagnosticResult, unsupported_scope_error

            box = call(engine.get, sandbox_id)
            if scope.strip().lower() not in ("container", "all"):
                raise unsupported_scope_error("logs", scope, ("container", "all"))
            text = box.console.read_text(errors="replace") if box.console.exists() else ""
            return DiagnosticResult(sandbox_id, "logs", scope.strip().lower(), "".join(text.splitlines(True)[-100:]))

        get_sandbox_event_diagnostics = _unsupported
        get_sandbox_logs = get_sandbox_inspect = get_sandbox_events = _unsupported

    return DoubleRuntime()


async def _serve(state: Path) -> None:
    import uvicorn
    from opensandbox_server.services import factory

    from dynrunner.doubles.opensandbox import LocalImage
    from dynrunner.doubles.opensandbox.sandboxes import Sandboxes

    shell = LocalImage(env={"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"})
    engine = Sandboxes(state, {SLEEPER: shell}, runtime="kubernetes", gateway=True)
    runtime = _runtime(engine)
    factory.create_sandbox_service = lambda *_, **__: runtime
    from opensandbox_server.main import app

    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task  # startup failed: raise its error
            return
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(json.dumps({"url": f"http://127.0.0.1:{port}", "api_key": API_KEY}), flush=True)
    await task


def main() -> None:
    state = Path(sys.argv[1])
    (state / "config.toml").write_text(CONFIG.format(key=API_KEY, state=state))
    os.environ["SANDBOX_CONFIG_PATH"] = str(state / "config.toml")
    asyncio.run(_serve(state))


if __name__ == "__main__":
    main()
