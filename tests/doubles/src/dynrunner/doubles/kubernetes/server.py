"""`ApiServer`: the Kubernetes API double on a free 127.0.0.1 port, in a thread of its own.

The official `kubernetes` client is synchronous, so the double owns an event loop in a
background thread; tests (and the kubelet, scheduler and SPIRE doubles, which run on the
same loop) reach the store through `call()`. `write_kubeconfig()` gives the client what
`config.load_kube_config` reads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from dynrunner.doubles.kubernetes import resources
from dynrunner.doubles.kubernetes.crds import CLUSTER_STATIC_ENTRY
from dynrunner.doubles.kubernetes.faults import Faults
from dynrunner.doubles.kubernetes.gc import GarbageCollector
from dynrunner.doubles.kubernetes.podlogs import LogSource
from dynrunner.doubles.kubernetes.rbac import ALLOW_ALL, Authorizer
from dynrunner.doubles.kubernetes.routes import DROP, Routes
from dynrunner.doubles.kubernetes.status import too_old
from dynrunner.doubles.kubernetes.store import Store

T = TypeVar("T")


class ApiServer:
    def __init__(
        self,
        *,
        namespaces: Sequence[str] = ("default", "kube-system"),
        crds: Sequence[dict[str, Any]] = (CLUSTER_STATIC_ENTRY,),
        rbac: Sequence[dict[str, Any]] = ALLOW_ALL,
        tokens: Sequence[str] | None = None,
        bookmark_interval: float = 60.0,
        default_watch_timeout: float = 1800.0,
        log_size: int = 10_000,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.store = Store(log_size)
        self.faults = Faults()
        self.authorizer = Authorizer(rbac)
        self.tokens = set(tokens) if tokens is not None else None
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self.requests = 0
        self._seed = (list(namespaces), list(crds))
        self._host, self._port = host, port
        self.url = ""
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kube-api-double", daemon=True)
        self._routes = Routes(self)
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.gc: GarbageCollector | None = None
        # Where a container's output is (the kubelet double sets it): (node, pod uid, container) → file.
        self.pod_logs: LogSource | None = None
        # Awaited on the loop before the controllers are cancelled (servers to close).
        self.on_stop: list[Callable[[], Awaitable[None]]] = []

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> ApiServer:
        self._thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        self.gc = GarbageCollector(self.store)
        self.spawn(self.gc.run(), "garbage-collector")
        namespaces, crds = self._seed
        for name in namespaces:
            self.store.create(resources.NAMESPACES, "", {"metadata": {"name": name}})
        for crd in crds:
            self.store.create(resources.CRDS, "", crd)
        self._runner = web.AppRunner(self._routes.app(), access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        port = server.sockets[0].getsockname()[1] if server is not None and hasattr(server, "sockets") else self._port
        self.url = f"http://{self._host}:{port}"

    def spawn(self, coro: Awaitable[Any], name: str) -> None:
        """Run a controller (kubelet, scheduler, ...) on the double's loop until stop()."""
        self._tasks.append(asyncio.ensure_future(coro, loop=self.loop))
        self._tasks[-1].set_name(name)
        self._tasks[-1].add_done_callback(_report_crash)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()

    async def _stop(self) -> None:
        for hook in self.on_stop:
            await hook()
        for queue in list(self._routes.open_watches):
            queue.put_nowait(None)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()

    @classmethod
    @contextmanager
    def running(cls, **options: Any) -> Iterator[ApiServer]:
        server = cls(**options).start()
        try:
            yield server
        finally:
            server.stop()

    # --- cross-thread access --------------------------------------------------------
    def run(self, coro: Awaitable[T], timeout: float = 30.0) -> T:
        """Run a coroutine on the double's loop and wait for it (from any other thread)."""
        future = asyncio.run_coroutine_threadsafe(_await(coro), self.loop)
        return future.result(timeout)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call `fn` on the double's loop (store methods are not thread-safe)."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def invoke() -> None:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(invoke)
        return future.result(30)

    # --- test hooks -----------------------------------------------------------------
    def drop_watches(self) -> None:
        """Cut every open watch connection without a final chunk (a network failure)."""

        def drop() -> None:
            for queue in list(self._routes.open_watches):
                queue.put_nowait(DROP)

        self.call(drop)

    def expire_watches(self) -> None:
        """Send every open watch a 410 Expired ERROR event, as to a watcher that fell behind."""

        def expire() -> None:
            for watcher in self.store.watchers():
                if watcher.queue in self._routes.open_watches:
                    watcher.close(too_old(self.store.revision, self.store.revision))

        self.call(expire)

    def compact(self) -> None:
        """Compact the event log: a watch from any earlier resourceVersion gets 410."""
        self.call(self.store.compact)

    def write_kubeconfig(self, path: Path, token: str | None = None, namespace: str = "default") -> Path:
        user: dict[str, Any] = {"token": token} if token else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "double", "user": user}],
            "contexts": [
                {"name": "double", "context": {"cluster": "double", "user": "double", "namespace": namespace}}
            ],
            "current-context": "double",
        }
        path.write_text(json.dumps(config, indent=2))
        return path


async def _await(coro: Awaitable[T]) -> T:
    return await coro


def _report_crash(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        import traceback

        traceback.print_exception(task.exception())
