"""`OpenSandboxDouble`: the double's Python API and its in-process HTTP server.

    images = {"registry.example/dynrunner-vm:1": LocalImage(files={...}, env={...})}
    async with OpenSandboxDouble.start(tmp_path, images=images) as osb:
        config = ConnectionConfig(domain=osb.url, api_key=osb.api_key)
        sandbox = await Sandbox.create("registry.example/dynrunner-vm:1", entrypoint=[...], connection_config=config)

Without a socket, `async with osb.running():` and route the SDK's httpx to `osb.app` (respx's
ASGI handler or `httpx.ASGITransport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from dynrunner.doubles.opensandbox.app import build_app
from dynrunner.doubles.opensandbox.boot import LocalImage
from dynrunner.doubles.opensandbox.sandboxes import Clock, CreateFailure, Runtime, Sandbox, Sandboxes
from dynrunner.doubles.serving import serve_asgi

_EXPIRY_POLL_S = 1.0


class OpenSandboxDouble:
    """An opensandbox-server whose sandboxes are local processes (see `sandboxes`, `boot`)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        images: Mapping[str, LocalImage] | None = None,
        api_key: str | None = None,
        runtime: Runtime = "docker",
        boot_delay_s: float = 0.0,
        max_timeout_s: int | None = None,
        gateway: bool = False,
    ) -> None:
        self.api_key = api_key if api_key is not None else secrets.token_urlsafe(16)
        self.clock = Clock()
        self.sandboxes = Sandboxes(
            Path(state_dir),
            images or {},
            runtime=runtime,
            boot_delay_s=boot_delay_s,
            max_timeout_s=max_timeout_s,
            clock=self.clock,
            gateway=gateway,
        )
        self._changed = asyncio.Event()
        self.sandboxes.on_change = self._changed.set
        self.requests: Counter[str] = Counter()
        """Requests received, by kind (`app.request_kind`): what a client costs the server."""
        self.app = build_app(self.sandboxes, self.api_key or None, self.requests)
        self.url = ""

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls, state_dir: Path, *, host: str = "127.0.0.1", port: int = 0, **options: Any
    ) -> AsyncIterator[OpenSandboxDouble]:
        """Serve on `host:port` (0 = a free port) until the block ends; then every sandbox is killed."""
        double = cls(state_dir, **options)
        async with double.running(), serve_asgi(double.app, host, port, name="OpenSandbox double") as url:
            double.url = url
            yield double

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The expiry timer, and killing every sandbox at the end (without an HTTP server: for
        tests that talk to `app` through `httpx.ASGITransport` or respx)."""
        expiry = asyncio.create_task(self._expire_forever(), name="opensandbox-double-expiry")
        try:
            yield
        finally:
            expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await expiry
            await self.sandboxes.close()

    async def _expire_forever(self) -> None:
        while True:
            await self.sandboxes.expire_due()
            self._changed.clear()
            due = self.sandboxes.next_expiry()
            wait = _EXPIRY_POLL_S
            if due is not None:
                wait = max(0.0, min(wait, (due - self.clock.now()).total_seconds()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=wait)

    # -- test controls ---------------------------------------------------------------------

    def add_image(self, uri: str, image: LocalImage) -> None:
        self.sandboxes.images[uri] = image

    def fail_next_create(self, failure: CreateFailure | None = None) -> None:
        """Make the next create fail (after creating the sandbox if `after_create`)."""
        self.sandboxes.create_failures.append(failure or CreateFailure())

    async def advance(self, seconds: float) -> list[str]:
        """Move the double's clock forward; returns the ids of the sandboxes that expired."""
        self.clock.offset += timedelta(seconds=seconds)
        return await self.sandboxes.expire_due()

    def sandbox(self, sandbox_id: str) -> Sandbox:
        return self.sandboxes.get(sandbox_id)

    def listed(self) -> list[Sandbox]:
        return self.sandboxes.all()

    async def wait_for_state(self, sandbox_id: str, *states: str, timeout_s: float = 30.0) -> Sandbox:
        """Wait until the sandbox is in one of `states` (raises TimeoutError)."""
        async with asyncio.timeout(timeout_s):
            while True:
                box = self.sandboxes.get(sandbox_id)
                if box.state in states:
                    return box
                await asyncio.sleep(0.02)
