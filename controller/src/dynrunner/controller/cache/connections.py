"""How many connections the cache server keeps, and which it lets go first.

Each connection is a file descriptor of the process: the controller's own when it serves the
cache. A job (or anything on the network) that opens connections and sends nothing, or half a
request, must not leave others unable to connect, nor the controller without descriptors.
aiohttp closes a connection that has sent no whole request head within its keep-alive timeout
(`Timeouts.headers_s`, counted from its start or its last answer); handlers time bodies and
downloads. What is left is their number: at most `cap` at once. At the cap a new connection
closes the one that has waited longest without a request in progress (half a request head
counts as none); when every connection is busy with a request, the new one gets a 503.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web

log = logging.getLogger(__name__)

BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def connection_cap(configured: int) -> int:
    """`configured`, but at most half the process's file descriptor limit: the rest stays for
    the files uploads and downloads open, the index and, in a controller, everything else."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or configured <= soft // 2:
        return configured
    log.warning(
        "cache: serving at most %d connections, half the file descriptor limit (%d), not cache.maxConnections (%d)",
        max(soft // 2, 1),
        soft,
        configured,
    )
    return max(soft // 2, 1)


class _Connection(asyncio.Protocol):
    """Passes everything on to aiohttp's protocol; tells the guard when it opens and closes."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.busy = 0
        self.idle_since = 0.0
        self.refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if not self.guard.admit(self):
            self.refused = True
            self.transport.write(BUSY)
            self.transport.close()
            return
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.release(self)
        if not self.refused:
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()


class ConnectionGuard:
    """The protocol factory for `loop.create_server`, around aiohttp's (`runner.server`), and
    the middleware that tells it which connections have a request in progress."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], cap: int) -> None:
        self._factory = factory
        self.cap = cap
        self._open: dict[asyncio.Protocol, _Connection] = {}
        self.evicted = 0
        self.refused = 0

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self, self._factory())

    @property
    def open(self) -> int:
        return len(self._open)

    def admit(self, connection: _Connection) -> bool:
        if len(self._open) >= self.cap and not self._evict_one():
            self.refused += 1
            return False
        connection.idle_since = asyncio.get_running_loop().time()
        self._open[connection.inner] = connection
        return True

    def release(self, connection: _Connection) -> None:
        if self._open.get(connection.inner) is connection:
            del self._open[connection.inner]

    def _evict_one(self) -> bool:
        idle = [c for c in self._open.values() if not c.busy]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.idle_since)
        self.release(oldest)
        if oldest.transport is not None:
            oldest.transport.abort()
        self.evicted += 1
        return True

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = self._open.get(cast(asyncio.Protocol, request.protocol))
        if connection is None:
            return await handler(request)
        connection.busy += 1
        try:
            return await handler(request)
        finally:
            connection.busy -= 1
            connection.idle_since = asyncio.get_running_loop().time()
