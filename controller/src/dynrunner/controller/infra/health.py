"""The operations endpoint: `/metrics`, `/healthz` and `/readyz` on one HTTP listener.

`/healthz` answers 200 while the event loop runs and `liveness()` (if given) says so — 503
with the reason while a part the process itself must keep running is down (the embedded
nats-server), so a liveness probe restarts a process that cannot recover. `/readyz`
answers 200 only when `readiness()` says so (NATS connected, Gitea reachable recently,
claimers running — the composition root decides) and otherwise 503 with the reason in the
body, so `kubectl describe` shows why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from dynrunner.controller.infra.metrics import Metrics

__all__ = ["HealthServer", "Readiness", "parse_address"]

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets) → (host, port); an empty host means every interface."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics address {address!r} must be host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


class HealthServer:
    def __init__(self, address: str, metrics: Metrics, readiness: Readiness, liveness: Readiness | None = None) -> None:
        self._host, self._port = parse_address(address)
        self._metrics = metrics
        self._readiness = readiness
        self._liveness = liveness
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._serve_health)
        app.router.add_get("/readyz", self._serve_ready)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            await runner.cleanup()
            raise OSError(err.errno, f"cannot listen on {self._host}:{self._port} for metrics/health: {err}") from err
        self._runner = runner
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        log.info("serving /metrics, /healthz and /readyz", extra={"url": self.url})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))  # text, or OpenMetrics if asked
        return web.Response(body=encode(self._metrics.registry), headers={"Content-Type": content_type})

    async def _serve_health(self, request: web.Request) -> web.Response:
        if self._liveness is None:
            return web.Response(text="ok\n")
        return _answer(self._liveness, "liveness", "ok", "not healthy")

    async def _serve_ready(self, request: web.Request) -> web.Response:
        return _answer(self._readiness, "readiness", "ready", "not ready")


def _answer(probe: Readiness, what: str, good: str, bad: str) -> web.Response:
    try:
        ok, reason = probe()
    except Exception as err:  # a broken probe must say so, not look healthy or crash the server
        log.exception("%s check failed", what)
        ok, reason = False, f"{what} check failed: {err}"
    if ok:
        return web.Response(text=f"{good}{': ' + reason if reason else ''}\n")
    return web.Response(status=503, text=f"{bad}: {reason or 'unknown reason'}\n")
