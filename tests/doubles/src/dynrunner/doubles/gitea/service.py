"""RunnerService and PingService over the engine, as Connect handlers.

Authentication follows Gitea's `withRunner` interceptor (every method but Register);
errors are shaped per mode (`errors.to_connect`). Engine calls run on the double's worker
threads, so concurrent requests really do race in the database.

FetchTask mirrors `PickTask`'s last step: on `main`, if the request is cancelled (client
timeout or disconnect) before the task could be answered, the claim is released and the job
waits again (go-gitea/gitea PRs #38200, #38343); released Gitea keeps the claim (the job runs
with nobody on it until the zombie reaper ends it).

Every authenticated RPC is metered (`costs.py`): the CPU its worker thread spends, by method.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from connectrpc.request import RequestContext

from dynrunner.doubles.gitea.engine import Engine
from dynrunner.doubles.gitea.errors import PlainError, RpcStatus, internal, to_connect
from dynrunner.doubles.gitea.store import Row
from dynrunner.proto._gen.ping.v1 import messages_pb2 as ping_pb
from dynrunner.proto._gen.runner.v1 import messages_pb2 as pb

T = TypeVar("T")
log = logging.getLogger(__name__)


class Worker:
    """Runs engine calls on the double's own thread pool and shapes their errors."""

    def __init__(self, engine: Engine, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        self.engine = engine
        self.pool = pool

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.wrap_future(self.pool.submit(fn, *args))
        except (RpcStatus, PlainError) as err:
            raise to_connect(err, self.engine.options.mode) from None


@dataclass(slots=True)
class Hooks:
    """Test hooks that widen real race windows so tests can hit them deterministically."""

    fetch_pause_s: float = 0.0  # FetchTask: between authentication and reloading the runner
    pick_pause_s: float = 0.0  # FetchTask: between reloading the runner and the pick
    claim_pause_s: float = 0.0  # FetchTask: between the candidate scan and the claim (two runners race)
    build_delay_s: float = 0.0  # FetchTask: between the claim and the answer (payload building)


def _credentials(ctx: RequestContext[Any, Any]) -> tuple[str, str]:
    headers = ctx.request_headers
    return headers.get("x-runner-uuid", ""), headers.get("x-runner-token", "")


class RunnerServiceImpl:
    """Each RPC is one trip to a worker thread: authentication (the interceptor) and the
    method run back to back there, as in Gitea's handler goroutine."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.engine = worker.engine
        self.hooks = Hooks()

    def _authenticated(self, uuid: str, token: str, method: str, fn: Callable[..., T], *args: Any) -> T:
        with self.engine.costs.measure(method):
            return fn(self.engine.authenticate(uuid, token, method), *args)

    async def _call_as_runner(self, ctx: RequestContext[Any, Any], method: str, fn: Callable[..., T], *args: Any) -> T:
        return await self.worker.call(self._authenticated, *_credentials(ctx), method, fn, *args)

    async def register(self, request: pb.RegisterRequest, ctx: RequestContext[Any, Any]) -> pb.RegisterResponse:
        runner = await self.worker.call(self.engine.register, request)
        return pb.RegisterResponse(runner=runner)

    async def declare(self, request: pb.DeclareRequest, ctx: RequestContext[Any, Any]) -> pb.DeclareResponse:
        declared = await self._call_as_runner(ctx, "Declare", self.engine.declare, request)
        if self.engine.profile.server_capabilities:
            ctx.response_headers["X-Gitea-Actions-Capabilities"] = self.engine.profile.server_capabilities
        return pb.DeclareResponse(runner=declared)

    async def fetch_task(self, request: pb.FetchTaskRequest, ctx: RequestContext[Any, Any]) -> pb.FetchTaskResponse:
        uuid, token = _credentials(ctx)
        if self.hooks.fetch_pause_s:
            runner = await self.worker.call(self.engine.authenticate, uuid, token, "FetchTask")
            await asyncio.sleep(self.hooks.fetch_pause_s)
            future = self.worker.pool.submit(self._pick, runner, request.tasks_version)
        else:
            future = self.worker.pool.submit(self._authenticated_pick, uuid, token, request.tasks_version)
        try:
            task, latest = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._release_undelivered)
            raise
        except (RpcStatus, PlainError) as err:
            raise to_connect(err, self.engine.options.mode) from None
        response = pb.FetchTaskResponse(tasks_version=latest)
        if task is not None:
            response.task.CopyFrom(task)
        return response

    def _authenticated_pick(self, uuid: str, token: str, tasks_version: int) -> tuple[pb.Task | None, int]:
        with self.engine.costs.measure("FetchTask"):
            return self._pick(self.engine.authenticate(uuid, token, "FetchTask"), tasks_version)

    def _pick(self, runner: Row, tasks_version: int) -> tuple[pb.Task | None, int]:
        claimed, latest = self.engine.pick(
            runner, tasks_version, pause_s=self.hooks.pick_pause_s, claim_pause_s=self.hooks.claim_pause_s
        )
        if claimed is None:
            return None, latest
        try:
            if self.hooks.build_delay_s:
                time.sleep(self.hooks.build_delay_s)
            return self.engine.build(claimed), latest
        except Exception as exc:
            self.engine.release(claimed["id"])
            raise internal(f"pick task: {exc}") from exc

    def _release_undelivered(self, future: concurrent.futures.Future[tuple[pb.Task | None, int]]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        task, _ = future.result()
        if task is None:
            return
        if not self.engine.profile.release_undelivered_claims:
            log.info(
                "task %d stays claimed although its FetchTask was cancelled (Gitea %s)",
                task.id,
                self.engine.profile.name,
            )
            return
        log.info("releasing task %d: its FetchTask was cancelled before the answer", task.id)
        self.engine.release(task.id)

    async def update_task(self, request: pb.UpdateTaskRequest, ctx: RequestContext[Any, Any]) -> pb.UpdateTaskResponse:
        return await self._call_as_runner(ctx, "UpdateTask", self.engine.update_task, request)

    async def update_log(self, request: pb.UpdateLogRequest, ctx: RequestContext[Any, Any]) -> pb.UpdateLogResponse:
        ack = await self._call_as_runner(ctx, "UpdateLog", self.engine.update_log, request)
        return pb.UpdateLogResponse(ack_index=ack)


class PingServiceImpl:
    """`routers/api/actions/ping/ping.go`: no authentication, echoes a greeting."""

    async def ping(self, request: ping_pb.PingRequest, ctx: RequestContext[Any, Any]) -> ping_pb.PingResponse:
        return ping_pb.PingResponse(data=f"Hello, {request.data}!")
