"""Following environments' starts: stage lines and heartbeats until the executor runs.

The launcher acknowledges a delivery as soon as the environment's objects exist and hands
the environment to `Starts`; a follower then reads the backend's start events
(`Backend.follow_start`), writes each event's line into the job log and heartbeats the task,
until the executor started (it owns the log and the task from then on) or the backend
said it never will (the reaper finalizes it). A slow start — an image pull of minutes —
thus holds a capacity permit, as the job always does, but no launch slot.

The reaper hands over any environment it finds still starting that nobody follows: after a
controller restart every start is followed again, the job log continuing at the index
Gitea reports. One follower per assignment id at a time; the credentials come from the
finalize record (without one, the start is still driven, silently).

A task that ends while its environment starts (a user cancelled the run, Gitea reaped it)
is not started: its environment is removed and, when Gitea still waits for it (the
cancelling handshake), the task is ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from dynrunner.controller.assignments.finalize_records import FinalizeRecord, FinalizeRecords
from dynrunner.controller.backends.base import Backend, Environment, StartEvent, StartStage
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.logs import log_context
from dynrunner.controller.infra.loops import Stopping
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.reporting.finalize import finalize_task
from dynrunner.controller.reporting.stagelog import (
    HEARTBEAT_INTERVAL_S,
    LAST_STAGE_RETRY,
    STAGE_RETRY,
    ClaimLine,
    Heartbeat,
    StageLog,
    TaskEnded,
)
from dynrunner.proto.gitea import GiteaClient, GiteaError, Result, RunnerCredentials
from dynrunner.proto.gitea.client import RetryPolicy

log = logging.getLogger(__name__)

RETRY_FOLLOW_S = 5.0
"""After a follower failed (the backend raised), the reaper's next hand-over waits this long."""


async def end_cancelled(client: GiteaClient, task_id: int, ended: TaskEnded) -> None:
    """The task ended before its executor started: when the runner still exists (Gitea's
    cancelling handshake), close the log and end the task so Gitea deletes the runner;
    otherwise Gitea did both already."""
    if ended.result is not None:
        with contextlib.suppress(GiteaError):
            await finalize_task(client, task_id, Result.CANCELLED, ["the job was cancelled before it started"])


class Starts:
    """The starts being followed in one pool."""

    def __init__(
        self,
        pool: str,
        *,
        backend: Backend,
        gitea: GiteaClient,
        records: FinalizeRecords,
        capacity: Capacity,
        metrics: Metrics,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        on_end: Callable[[str], None] = lambda _: None,
    ) -> None:
        """`on_end(assignment_id)` is called when a follower stops (the reaper looks again)."""
        self.pool = pool
        self._backend = backend
        self._gitea = gitea
        self._records = records
        self._capacity = capacity
        self._metrics = metrics
        self._heartbeat_interval_s = heartbeat_interval_s
        self._on_end = on_end
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._retry_after: dict[str, float] = {}
        """Assignment id → when a follower that failed may be started again (kept only until
        then: an environment reaped meanwhile is never handed over again)."""
        self._stopping = Stopping()
        self.exclusive: Callable[[str], AbstractAsyncContextManager[bool]] | None = None
        """An exclusive lease among the controller replicas (`leases.exclusive`): one
        follower per start in the whole cluster, not only in this process."""

    def __contains__(self, assignment_id: object) -> bool:
        return assignment_id in self._followers

    def __len__(self) -> int:
        return len(self._followers)

    def ids(self) -> set[str]:
        return set(self._followers)

    def follow(
        self,
        env: Environment,
        *,
        record: FinalizeRecord | None = None,
        heartbeat: Heartbeat | None = None,
        claim: ClaimLine | None = None,
    ) -> bool:
        """Follow `env`'s start unless it is followed already; False if it was not taken.

        `record`: the credentials (else read from the finalize records); `heartbeat`: one
        already beating for the task (the launcher's, handed over without a gap); `claim`:
        the launcher just created it, and this is the claim's line, so the log holds at most
        that line. Whatever is not taken is let go of here."""
        aid = env.assignment_id
        loop = asyncio.get_running_loop()
        if self._stopping.is_set() or aid in self._followers or loop.time() < self._retry_after.get(aid, 0.0):
            if heartbeat is not None:
                heartbeat.cancel()
            if claim is not None:
                claim.discard()
            return False
        self._retry_after = {key: at for key, at in self._retry_after.items() if at > loop.time()}
        task = asyncio.create_task(self._run(env, record, heartbeat, claim), name=f"start-{aid}")
        self._followers[aid] = task
        task.add_done_callback(lambda _: self._done(aid))
        return True

    def _done(self, assignment_id: str) -> None:
        self._followers.pop(assignment_id, None)
        self._on_end(assignment_id)

    def stop(self) -> None:
        """Follow nothing more; each follower lets go at its next wait."""
        self._stopping.set()

    async def aclose(self) -> None:
        """Stop following (a shutdown): environments go on starting, and the next controller
        follows them again. A follower whose cancellation a request lost lets go at its next
        wait for the start (`stop()`)."""
        self.stop()
        followers = list(self._followers.values())
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)

    # -- one follower ---------------------------------------------------------------------

    async def _run(
        self, env: Environment, record: FinalizeRecord | None, heartbeat: Heartbeat | None, claim: ClaimLine | None
    ) -> None:
        with log_context(assignment_id=env.assignment_id, task_id=env.task_id, pool=self.pool):
            try:
                if self.exclusive is None:
                    await self._follow_with(env, record, heartbeat, claim)
                    return
                async with self.exclusive(f"following.{env.assignment_id}") as held:
                    if held:
                        await self._follow_with(env, record, heartbeat, claim)
                    else:  # another replica follows it; the reaper hands it over if that one stops
                        self._retry_after[env.assignment_id] = asyncio.get_running_loop().time() + RETRY_FOLLOW_S
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._retry_after[env.assignment_id] = asyncio.get_running_loop().time() + RETRY_FOLLOW_S
                self._metrics.errors.labels(pool=self.pool, kind="backend").inc()
                log.warning("following the start of %s failed (the reaper hands it over again): %s", env.name, err)
            finally:
                if heartbeat is not None:
                    heartbeat.cancel()
                if claim is not None:
                    claim.discard()  # let go of by then (`_follow`), unless the follower never ran

    async def _follow_with(
        self, env: Environment, record: FinalizeRecord | None, heartbeat: Heartbeat | None, claim: ClaimLine | None
    ) -> None:
        if record is None:
            record = await self._record(env)
        await self._follow(env, record, heartbeat, claim)

    async def _record(self, env: Environment) -> FinalizeRecord | None:
        try:
            record = await self._records.get(env.assignment_id)
        except Exception as err:
            log.warning("finalize record of %s cannot be read (%s); following its start without Gitea", env.name, err)
            return None
        if record is None:
            log.warning("%s has no finalize record; following its start without Gitea", env.name)
        return record

    async def _follow(
        self, env: Environment, record: FinalizeRecord | None, heartbeat: Heartbeat | None, claim: ClaimLine | None
    ) -> None:
        client = None
        if record is not None:
            client = self._gitea.with_credentials(RunnerCredentials(record.runner.uuid, record.runner.token))
            if heartbeat is None:
                heartbeat = Heartbeat(client, record.task_id, interval_s=self._heartbeat_interval_s)
                heartbeat.start()
        lines = _Lines(claim, client, env.task_id)
        events = self._backend.follow_start(env)
        try:
            async for event in _until_ended(events, heartbeat, self._stopping):
                if event.stage is StartStage.PROGRESS:
                    await lines.write(event.line, STAGE_RETRY)
                elif event.stage is StartStage.STARTING:
                    # The backend starts the executor when asked for the next event: nothing of
                    # ours may reach Gitea after that.
                    await _stop(heartbeat)
                    await lines.write(event.line, LAST_STAGE_RETRY, last=True)
                elif event.stage is StartStage.STARTED:
                    await _stop(heartbeat, check=False)
                    await lines.aclose()  # the executor owns the log
                    log.info("executor of %s started%s", env.name, f": {event.line}" if event.line else "")
                else:
                    await _stop(heartbeat, check=False)
                    reason = event.diagnosis.reason.value if event.diagnosis else "unknown"
                    log.warning("%s will not start (%s): %s", env.name, reason, event.diagnosis)
                if event.stage.final:
                    return
            if not self._stopping.is_set():
                log.warning("the start of %s ended without a final event", env.name)
        except TaskEnded as ended:
            await _aclose(events)
            await _stop(heartbeat, check=False)
            assert client is not None  # only a heartbeat raises it
            await self._ended(env, client, lines, ended)
        finally:
            await _aclose(events)
            await lines.aclose()

    async def _ended(self, env: Environment, client: GiteaClient, lines: _Lines, ended: TaskEnded) -> None:
        log.info("%s; not starting it", ended)
        if ended.result is not None:  # else the runner is gone: nothing can be written
            await lines.claim_first()
        await end_cancelled(client, env.task_id, ended)
        self._metrics.results.labels(pool=self.pool, result="cancelled").inc()
        try:
            await self._backend.delete(env)
        except Exception as err:
            log.warning("could not remove %s: %s (the reaper will)", env.name, err)
            return
        with contextlib.suppress(Exception):
            await self._records.delete(env.assignment_id)
        self._capacity.release(env.assignment_id)


class _Lines:
    """The stage lines of one follower: the claim's line (a fresh launch) goes with the first."""

    def __init__(self, claim: ClaimLine | None, client: GiteaClient | None, task_id: int) -> None:
        self._claim = claim
        self._client = client
        self._task_id = task_id
        self._log: StageLog | None = None

    async def write(self, line: str, retry: RetryPolicy, *, last: bool = False) -> None:
        """Append `line`; `last`: the executor may start after it, so a claim line still held
        is written now (alone, if `line` is empty)."""
        if self._client is None or not (line or last):
            return
        if self._log is None:
            rows = await self._claim.take() if self._claim is not None else []
            if not (line or rows):
                return
            # Fresh: the log holds at most the claim's line; else ask Gitea where it ends.
            start = 0 if rows else (1 if self._claim is not None else None)
            self._log = StageLog(self._client, self._task_id, next_index=start)
            await self._log.write(*[line] if line else [], before=rows, retry=retry)
        elif line:
            await self._log.write(line, retry=retry)

    async def claim_first(self) -> None:
        """Before the task is finalized here: the claim's line, if it is still held."""
        if self._claim is not None:
            await self._claim.write()

    async def aclose(self) -> None:
        if self._claim is not None:
            await self._claim.aclose()


async def _until_ended(
    events: AsyncIterator[StartEvent], heartbeat: Heartbeat | None, stopping: Stopping
) -> AsyncIterator[StartEvent]:
    """`events`, until the heartbeat learns that the task ended: then TaskEnded, even while an
    event is awaited (a pull of minutes is not waited out for a cancelled run); or until
    `stopping` is set: then nothing more."""
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        while not stopping.is_set():
            nxt: asyncio.Future[StartEvent] = asyncio.ensure_future(anext(events))
            try:
                beating = heartbeat.task if heartbeat is not None else None
                waits: list[asyncio.Future[Any]] = [nxt, stopped] if beating is None else [nxt, stopped, beating]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if heartbeat is not None and heartbeat.ended is not None and not nxt.done():
                    raise heartbeat.ended
                if not nxt.done():
                    return  # stopping
                event = nxt.result()
            except StopAsyncIteration:
                return
            finally:
                if not nxt.done():
                    nxt.cancel()
                    with contextlib.suppress(BaseException):
                        await nxt
            yield event
    finally:
        stopped.cancel()


async def _stop(heartbeat: Heartbeat | None, *, check: bool = True) -> None:
    """Stop beating; with `check`, raise TaskEnded if a beat learned the task ended."""
    if heartbeat is None:
        return
    await heartbeat.stop()
    if check and heartbeat.ended is not None:
        raise heartbeat.ended


async def _aclose(events: AsyncIterator[StartEvent]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()
