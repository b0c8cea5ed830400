"""Running the cache server: from a `CacheConfig` to a listening server with its sweeper.

Used by the controller (when `cache.serve`) and by `dynrunner-controller cache-server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from dynrunner.controller.cache.connections import ConnectionGuard, connection_cap
from dynrunner.controller.cache.index import Index
from dynrunner.controller.cache.server import CacheServer, Timeouts
from dynrunner.controller.cache.service import CacheService, Limits
from dynrunner.controller.cache.storage import CacheStorage
from dynrunner.controller.config.model import CacheConfig
from dynrunner.controller.infra.health import parse_address
from dynrunner.controller.infra.loops import Stopping
from dynrunner.controller.infra.sealing import SealingError, ensure_key_file, read_key_file
from dynrunner.proto.assignment import ArtifactStoreOptions

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 600.0
PENDING_S = 6 * 3600.0
"""A reservation not committed within this is dropped (the longest job that would still save)."""


def cache_key(cfg: CacheConfig, *, create: bool) -> bytes:
    """The grant key; created (random, 0600) when `create` and missing: a controller that
    serves the cache itself may make it, a controller or server sharing one must be given it."""
    assert cfg.key_file is not None, "CacheConfig.with_defaults sets key_file"
    if create:
        ensure_key_file(cfg.key_file)
    try:
        return read_key_file(cfg.key_file)
    except SealingError as err:
        raise OSError(str(err).replace("sealing key file", "cache key file (cache.keyFile)")) from None


def storage_options(cfg: CacheConfig) -> ArtifactStoreOptions:
    assert cfg.dir is not None, "CacheConfig.with_defaults sets dir"
    if cfg.storage.driver:
        return cfg.storage.options()
    return ArtifactStoreOptions(driver="Filesystem", path=str(Path(cfg.dir, "blobs").resolve()))


def build_service(cfg: CacheConfig, key: bytes, clock: Callable[[], float] = time.time) -> CacheService:
    assert cfg.dir is not None
    options = storage_options(cfg)
    if options.driver == "Filesystem":
        Path(options.path).mkdir(parents=True, exist_ok=True)
    return CacheService(
        Index(Path(cfg.dir, "index.db"), clock),
        CacheStorage(options, Path(cfg.dir, "staging"), cfg.max_entry_bytes),
        grant_key=key,
        limits=Limits(
            max_entry_bytes=cfg.max_entry_bytes,
            repo_bytes=cfg.repo_size_limit_bytes,
            total_bytes=cfg.total_size_limit_bytes,
            retention_s=cfg.retention_days * 86400,
            pending_s=PENDING_S,
            max_entries=cfg.max_entries_per_repository,
        ),
        clock=clock,
    )


@contextlib.asynccontextmanager
async def serve_cache(
    cfg: CacheConfig,
    *,
    create_key: bool = True,
    sweep_interval_s: float = SWEEP_INTERVAL_S,
    timeouts: Timeouts | None = None,
) -> AsyncIterator[CacheServer]:
    """Listen on `cfg.listen` until the block ends. With port 0 (tests, the demo) the server's
    public URL is the address it got."""
    service = build_service(cfg, cache_key(cfg, create=create_key))
    host, port = parse_address(cfg.listen)
    timeouts = timeouts or Timeouts()
    server = CacheServer(service, cfg.url or f"http://{host}:{port}", timeouts=timeouts)
    app = server.app()
    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=timeouts.headers_s)
    await runner.setup()
    assert runner.server is not None
    guard = ConnectionGuard(runner.server, connection_cap(cfg.max_connections))
    server.connections = guard
    try:
        try:
            listener = await asyncio.get_running_loop().create_server(guard, host, port, reuse_address=True)
        except OSError as err:
            raise OSError(err.errno, f"cannot listen on {cfg.listen} for the cache server: {err}") from err
        if port == 0:
            bound_host, bound_port = listener.sockets[0].getsockname()[:2]
            server.public_url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}"
        log.info("serving the actions cache", extra={"url": server.public_url, "listen": cfg.listen})
        stopping = Stopping()
        sweeper = asyncio.create_task(_sweep(service, sweep_interval_s, stopping), name="cache-sweeper")
        try:
            yield server
        finally:
            stopping.set()
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            listener.close()
    finally:
        await runner.cleanup()
        service.index.close()


async def _sweep(service: CacheService, interval_s: float, stopping: Stopping) -> None:
    """Every `interval_s` until `stopping` (the sweep in hand runs in a thread and is let end)."""
    while not stopping.is_set():
        try:
            evicted = await asyncio.to_thread(service.sweep)
            if evicted:
                log.info("cache: the sweep removed %d entries", evicted)
        except Exception:  # a failed sweep must not stop the server; the next one retries
            log.exception("cache: the sweep failed")
        await stopping.sleep(interval_s)


def run_standalone(config_path: Path | None) -> int:
    """`dynrunner-controller cache-server`: 0 after SIGTERM/SIGINT, 2 for a bad configuration,
    1 when it cannot start (no key file, the address taken). Its key file must exist: the
    controllers that sign grants for it hold the same key."""
    from dynrunner.controller.config.model import ConfigError, load_cache_server_config
    from dynrunner.controller.infra.logs import configure_logging

    try:
        cfg = load_cache_server_config(config_path)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    configure_logging(cfg.logging.level, cfg.logging.json_format)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with serve_cache(cfg.cache, create_key=False):
            await stop.wait()

    try:
        asyncio.run(serve())
    except OSError as err:
        print(f"dynrunner-controller cache-server: cannot start: {err}", file=sys.stderr)
        return 1
    return 0
