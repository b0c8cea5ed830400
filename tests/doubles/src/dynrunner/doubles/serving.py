"""Serving an ASGI app inside the test's event loop (every HTTP double uses it)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn


class InProcessServer(uvicorn.Server):
    """uvicorn without its signal handlers (the host process owns signals) that stops as
    soon as asked instead of at its next 0.1 s tick."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.exit_requested = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown without its fixed 0.1 s pause before waiting for connections."""
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        await asyncio.sleep(0.005)
        try:
            await asyncio.wait_for(self._wait_tasks_to_complete(), timeout=self.config.timeout_graceful_shutdown)
        except TimeoutError:
            for task in self.server_state.tasks:
                task.cancel(msg="the double is shutting down")
        await self.lifespan.shutdown()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000  # one tick a second: on_tick refreshes the Date header every 10
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exit_requested.wait(), timeout=1.0)
            self.should_exit = self.should_exit or self.exit_requested.is_set()


@contextlib.asynccontextmanager
async def serve_asgi(app: Any, host: str = "127.0.0.1", port: int = 0, *, name: str = "double") -> AsyncIterator[str]:
    """Serve `app` on `host:port` (0 = a free port) until the block ends; yields the base URL
    once the socket accepts connections."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    url = f"http://{f'[{host}]' if ':' in host else host}:{bound_port}"
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    server = InProcessServer(config)
    serve = asyncio.create_task(server.serve(sockets=[sock]), name=f"{name}-server")
    try:
        while not server.started:
            if serve.done():
                await serve  # startup failed: raise its error
                raise RuntimeError(f"the {name}'s server stopped during startup")
            await asyncio.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        server.exit_requested.set()
        await serve
        sock.close()
