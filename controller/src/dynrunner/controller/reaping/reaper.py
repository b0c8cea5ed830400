"""The reaper: finished environments are deleted, failed ones finalized, orphans collected.

Each pool's environments are listed and observed — every second, or, for a backend that
watches its environments (`Watches`), when its watch says one changed (plus a full sweep
every `RESYNC_INTERVAL_S` as a safety net):

* succeeded (the executor finalized its task) → delete the environment, release the permit;
* failed (ended — or stuck past its deadline — before the executor finalized) → finalize the
  task failed with the diagnosis in the job log and a final state for each step (from the
  executor's last accepted report when the backend has it, `finalize.final_steps`), then
  delete it and release the permit; when that report shows the executor had finalized (its
  wrapper died alone, say), nothing is sent;
* gone (deleted behind our back, lost with its node; also one seen before and now missing)
  → finalize the task failed ("the environment disappeared …"), release the permit;
* starting, and nobody follows its start (a controller restart) → hand it to the pool's
  start followers, which write its stage lines and heartbeat until the executor runs.

Finalizing needs the claiming runner's credential and the values to mask: they come from the
assignment's finalize record (`finalize_records`), never from the environment, so a vanished
environment's task is finalized too. When Gitea cannot be reached the environment stays and
the next sweep tries again (after one such failure a round finalizes nothing more, but still
reaps what needs no Gitea). The record is deleted with the environment. A runner that no
longer exists is not a task that ended: Gitea deletes an ephemeral runner with its task, but
an admin may delete it while the task runs, and then the task stays running in Gitea until
its zombie reaper fails it; such a task is counted as `runner-gone`, not `reported`.

A failed environment whose assignment JetStream still holds unacknowledged is left alone: the
launch that made it was interrupted (a controller killed between creating it and
acknowledging), and the assignment's redelivery resumes it.

Less often it removes orphans (leftovers of interrupted creates) and trims capacity
permits recovered at start to what JetStream still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime

from dynrunner.controller.assignments.finalize_records import FinalizeRecord, FinalizeRecords
from dynrunner.controller.backends.base import Backend, Diagnosis, Environment, FailureReason, Observation, Phase
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.logs import log_context
from dynrunner.controller.infra.loops import Stopping
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import SealingError
from dynrunner.controller.reporting.finalize import FinalizeOutcome, final_steps, finalize_failed
from dynrunner.proto.gitea import GiteaClient, GiteaError, Result, RunnerCredentials
from dynrunner.proto.masking import Masker, add_mask_values

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
RESYNC_INTERVAL_S = 30.0
"""Between full sweeps of a pool whose backend wakes the reaper (it misses nothing it is told;
this catches what a watch could not tell)."""
ORPHAN_INTERVAL_S = 60.0
VANISHED = Diagnosis(
    FailureReason.VANISHED,
    "the job's environment disappeared before its executor reported the job's result "
    "(deleted by someone else, or lost with its machine)",
)


@dataclass
class PoolWatch:
    """What the reaper needs of one pool."""

    name: str
    backend: Backend
    capacity: Capacity
    launching: Callable[[], Collection[str]]
    """Assignment ids being launched or whose start is being followed: left alone."""
    records: FinalizeRecords | None = None
    """Where each task's finalize record is (None: tasks cannot be finalized here)."""
    follow: Callable[[Environment], object] | None = None
    """Hands an environment still starting, that nobody follows, to the pool's start followers."""
    pending: Callable[[], Awaitable[int]] | None = None
    """JetStream's count of the pool's unacknowledged assignments (to trim recovered permits)."""
    unacknowledged: Callable[[Environment], Awaitable[bool]] | None = None
    """Whether JetStream still holds the environment's assignment unacknowledged (by the stream
    sequence the environment recorded): its launch was interrupted and will be resumed."""
    watched: bool = False
    """The backend wakes the reaper (`Reaper.wake`) when an environment changes."""
    exclusive: Callable[[str], AbstractAsyncContextManager[bool]] | None = None
    """An exclusive lease among the controller replicas (`leases.exclusive`): an environment
    is reaped — its task finalized, its record consumed — by one replica at a time."""


def mask_secrets(text: str, values: Sequence[str]) -> str:
    """`text` (the executor's output) masked as the executor masks the job log, with the same
    masker: every credential of the assignment (`values`, from its finalize record), and any
    value an `::add-mask::` line in `text` registers, in every form the masker knows (each
    line of a multi-line value, base64, JSON and URL escapes, ...)."""
    masker = Masker(values)
    for value in add_mask_values(text):
        masker.add(value)
    return masker.mask(text)


def failure_report(observation: Observation, masks: Sequence[str]) -> str:
    """The lines the user reads: the diagnosis, then the executor's last output (masked)."""
    diagnosis = observation.diagnosis
    if diagnosis is None:
        return "the job's environment ended without its executor reporting a result"
    text = f"{diagnosis.message} [{diagnosis.reason.value}]"
    if diagnosis.detail:
        text += f"\n{diagnosis.detail_heading}\n" + mask_secrets(diagnosis.detail, masks)
    return text


class Reaper:
    def __init__(
        self,
        pools: Iterable[PoolWatch],
        *,
        gitea: GiteaClient,
        metrics: Metrics,
        interval_s: float = SWEEP_INTERVAL_S,
        resync_s: float = RESYNC_INTERVAL_S,
        orphan_interval_s: float = ORPHAN_INTERVAL_S,
        revoke_cache: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """`revoke_cache`: ends the cache registration of a job the reaper finalizes (its
        executor, which would have revoked it, did not get there)."""
        self._pools = list(pools)
        self._revoke_cache = revoke_cache
        self._gitea = gitea
        self._metrics = metrics
        self._interval_s = interval_s
        self._resync_s = resync_s
        self._orphan_interval_s = orphan_interval_s
        names = [p.name for p in self._pools]
        self._seen: dict[str, set[str]] = {name: set() for name in names}
        self._ready_noted: dict[str, set[str]] = {name: set() for name in names}
        self._awaiting_redelivery: dict[str, set[str]] = {name: set() for name in names}
        self._dirty: dict[str, set[str | None]] = {name: set() for name in names}
        self._next_sweep: dict[str, float] = dict.fromkeys(names, 0.0)
        self._reaped: dict[str, set[str]] = {}
        """Assignment ids reaped in the current sweep or look (they are no longer seen)."""
        self._woken = asyncio.Event()
        self._gitea_down = False
        """Set when a finalize outlasted the client's retries in this round: the other failed
        environments wait for the next round instead of each spending the retry budget."""
        self._stopping = Stopping()
        self.sweeps = 0
        """Full sweeps so far (for tests and the benchmark)."""

    def stop(self) -> None:
        """End `run()` once the round in hand is over (never by cancelling: a reap half done
        is looked at again, but costs a round)."""
        self._stopping.set()

    def wake(self, pool: str, assignment_id: str | None = None) -> None:
        """Look at that pool's environment of `assignment_id` soon (None: at all of them).
        Wakes from a backend's watch and from the start followers arrive here."""
        dirty = self._dirty.get(pool)
        if dirty is not None:
            dirty.add(assignment_id)
            self._woken.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_orphans = loop.time() + self._orphan_interval_s
        while not self._stopping.is_set():
            self._woken.clear()
            self._gitea_down = False
            for pool in self._pools:
                if self._stopping.is_set():
                    break
                try:
                    await self._round(pool, loop.time())
                except Exception as err:
                    self._metrics.errors.labels(pool=pool.name, kind="reaper").inc()
                    log.exception("pool %s: sweep failed: %s", pool.name, err)
            if loop.time() >= next_orphans:
                next_orphans = loop.time() + self._orphan_interval_s
                for pool in self._pools:
                    await self.collect(pool)
            wait = min([*self._next_sweep.values(), next_orphans]) - loop.time()
            if wait > 0 and not self._woken.is_set():
                stopping = asyncio.ensure_future(self._stopping.wait())
                woken = asyncio.ensure_future(self._woken.wait())
                await asyncio.wait({stopping, woken}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                for waiter in (stopping, woken):
                    waiter.cancel()

    async def _round(self, pool: PoolWatch, now: float) -> None:
        dirty, self._dirty[pool.name] = self._dirty[pool.name], set()
        if None in dirty or now >= self._next_sweep[pool.name]:
            self._next_sweep[pool.name] = now + (self._resync_s if pool.watched else self._interval_s)
            await self.sweep(pool)
        elif dirty:
            await self.look_at(pool, {aid for aid in dirty if aid is not None})

    async def sweep(self, pool: PoolWatch) -> None:
        """Every environment of the pool."""
        self.sweeps += 1
        envs = await pool.backend.list_owned()
        launching = set(pool.launching())
        present = {env.assignment_id for env in envs}
        for env in envs:
            if env.assignment_id not in launching:
                await self._guarded(pool, env.assignment_id, env)
        present -= self._reaped.pop(pool.name, set())
        seen = self._seen[pool.name]
        for assignment_id in seen - present - launching:
            # Seen before, gone now, and not reaped here: it vanished outside our control.
            if not await self._guarded(pool, assignment_id, None):
                present.add(assignment_id)  # not finalized yet (Gitea down): try again
        self._reaped.pop(pool.name, None)
        # One that vanished while its launcher or start follower holds it is judged once they
        # let go (their wake): forgetting it now would take it for one never ours then.
        present |= seen & launching
        self._seen[pool.name] = present
        self._ready_noted[pool.name] &= present
        self._awaiting_redelivery[pool.name] &= present

    async def look_at(self, pool: PoolWatch, assignment_ids: Collection[str]) -> None:
        """The environments of these assignments only (a watch said they changed)."""
        launching = set(pool.launching())
        seen = self._seen[pool.name]
        for assignment_id in assignment_ids:
            env = await pool.backend.find(assignment_id)
            if env is None and assignment_id not in seen:
                continue  # reaped already, or never ours
            if assignment_id in launching:
                if env is not None:
                    seen.add(assignment_id)  # its launcher wakes us once it lets go
                continue
            await self._guarded(pool, assignment_id, env)
            if assignment_id in self._reaped.pop(pool.name, set()):
                seen.discard(assignment_id)
            elif env is not None:
                seen.add(assignment_id)

    async def collect(self, pool: PoolWatch) -> None:
        """Orphans, and recovered permits JetStream no longer backs."""
        try:
            removed = await pool.backend.collect_orphans(pool.launching())
            for item in removed:
                log.warning("pool %s: removed orphan %s", pool.name, item)
            if pool.pending is not None:
                pool.capacity.limit_recovered(await pool.pending())
        except Exception as err:
            self._metrics.errors.labels(pool=pool.name, kind="orphans").inc()
            log.warning("pool %s: orphan collection failed: %s", pool.name, err)

    async def _guarded(self, pool: PoolWatch, assignment_id: str, env: Environment | None) -> bool:
        """Handle one environment (None: it vanished); one environment's trouble must not hold
        up the others. True when it is done with (reaped, or nothing to do)."""
        task_id = env.task_id if env is not None else None
        with log_context(assignment_id=assignment_id, task_id=task_id, pool=pool.name):
            try:
                if env is None:
                    return await self._reap(pool, assignment_id, None, Observation(Phase.GONE, VANISHED))
                return await self._handle(pool, env)
            except Exception as err:
                self._metrics.errors.labels(pool=pool.name, kind="reaper").inc()
                log.exception("environment of %s: reaping failed: %s", assignment_id, err)
                return False

    async def _handle(self, pool: PoolWatch, env: Environment) -> bool:
        observation = await pool.backend.observe(env)
        self._note_ready(pool, env, observation)
        if not observation.phase.finished:
            pool.capacity.adopt(env.assignment_id)
            if observation.phase is Phase.STARTING and pool.follow is not None:
                pool.follow(env)
            return True
        if observation.phase is Phase.FAILED and await self._redelivery_pending(pool, env):
            pool.capacity.adopt(env.assignment_id)
            return True  # the launch was interrupted; its redelivery resumes it (or gives up)
        return await self._reap(pool, env.assignment_id, env, observation)

    async def _reap(
        self, pool: PoolWatch, assignment_id: str, env: Environment | None, observation: Observation
    ) -> bool:
        """`_reap_once` under the replicas' lease on reaping this assignment: while another
        replica reaps it, this one leaves it (False: looked at again in the next round)."""
        if pool.exclusive is None:
            return await self._reap_once(pool, assignment_id, env, observation)
        async with pool.exclusive(f"reaping.{assignment_id}") as held:
            if not held:
                return False
            return await self._reap_once(pool, assignment_id, env, observation)

    async def _reap_once(
        self, pool: PoolWatch, assignment_id: str, env: Environment | None, observation: Observation
    ) -> bool:
        """`_reap_alone`, unless the finalize record was consumed: then the task was settled
        already — by another replica's reaper, or by this replica's launcher or start follower
        (a run cancelled before its executor started, counted there) — and each deletes the
        environment before it consumes the record: only this replica's accounts are left."""
        if pool.records is not None and await self._consumed(pool, assignment_id):
            pool.capacity.release(assignment_id)
            self._reaped.setdefault(pool.name, set()).add(assignment_id)
            log.info("environment of %s is gone and its task was settled already", assignment_id)
            return True
        return await self._reap_alone(pool, assignment_id, env, observation)

    async def _reap_alone(
        self, pool: PoolWatch, assignment_id: str, env: Environment | None, observation: Observation
    ) -> bool:
        """A finished environment (or one that vanished): finalize its task when the executor
        did not, delete it, forget its record, release its permit. False when it must wait for
        the next sweep (Gitea or NATS cannot be reached)."""
        phase = observation.phase
        name = env.name if env is not None else assignment_id
        reported = observation.reported.result if observation.reported is not None else Result.UNSPECIFIED
        if phase is Phase.SUCCEEDED:
            self._metrics.results.labels(pool=pool.name, result="reported").inc()
            if observation.identity_wait_s is not None:
                self._metrics.identity_wait.labels(pool=pool.name).observe(observation.identity_wait_s)
        elif reported is not Result.UNSPECIFIED:
            self._metrics.results.labels(pool=pool.name, result="reported").inc()
            log.info(
                "environment %s: %s, but its executor had finalized the task (%s)",
                name,
                "ended without an exit status" if observation.diagnosis is None else observation.diagnosis.message,
                reported.word,
            )
        else:
            if phase is Phase.GONE and observation.diagnosis is None:
                observation = Observation(Phase.GONE, VANISHED)
            if self._gitea_down or not await self._finalize(pool, assignment_id, name, observation):
                return False  # keep the environment and its record for the next sweep
        if env is not None and phase is not Phase.GONE:
            await pool.backend.delete(env)
        elif env is not None:
            with contextlib.suppress(Exception):
                await pool.backend.delete(env)  # what a backend still keeps of it (a tombstone)
        await self._forget(pool, assignment_id)
        if env is not None:
            self._metrics.job_duration.labels(pool=pool.name).observe(
                max(0.0, (datetime.now(UTC) - env.created_at).total_seconds())
            )
        pool.capacity.release(assignment_id)
        self._reaped.setdefault(pool.name, set()).add(assignment_id)
        log.info("environment %s reaped (%s)", name, phase.value)
        return True

    async def _forget(self, pool: PoolWatch, assignment_id: str) -> None:
        if pool.records is None:
            return
        try:
            await pool.records.delete(assignment_id)
        except Exception as err:
            log.warning("the finalize record of %s stays until it expires: %s", assignment_id, err)

    async def _end_cache_registration(self, pool: PoolWatch, record: FinalizeRecord) -> None:
        """`revoke_cache`: ends the cache registration the job's executor would have ended."""
        if self._revoke_cache is None or not record.cache_token:
            return
        try:
            await self._revoke_cache(record.cache_token)
        except Exception as err:  # best effort: the grant expires at the job's deadline anyway
            self._metrics.errors.labels(pool=pool.name, kind="cache").inc()
            log.warning("task %s: its cache registration could not be revoked: %s", record.task_id, err)

    async def _redelivery_pending(self, pool: PoolWatch, env: Environment) -> bool:
        """The environment's assignment is still unacknowledged in JetStream: the launch that
        made it was interrupted (the controller was killed between creating it and
        acknowledging), and the message's redelivery resumes it, or finalizes the task after
        the last attempt. Finalizing it here would fail a job that is about to run. When NATS
        cannot tell, the environment waits for the next sweep."""
        if pool.unacknowledged is None or env.stream_seq is None:
            return False
        try:
            pending = await pool.unacknowledged(env)
        except Exception as err:
            self._metrics.errors.labels(pool=pool.name, kind="nats").inc()
            log.warning("environment %s: cannot tell whether its assignment awaits redelivery: %s", env.name, err)
            return True
        waiting = self._awaiting_redelivery[pool.name]
        if pending and env.assignment_id not in waiting:
            log.info("environment %s: its launch was interrupted; leaving it to the assignment's redelivery", env.name)
        if pending:
            waiting.add(env.assignment_id)
        else:
            waiting.discard(env.assignment_id)
        return pending

    def _note_ready(self, pool: PoolWatch, env: Environment, observation: Observation) -> None:
        """launched → executor-ready, once per environment, from the backend's own timestamps."""
        if observation.ready_at is None or env.assignment_id in self._ready_noted[pool.name]:
            return
        self._ready_noted[pool.name].add(env.assignment_id)
        latency = (observation.ready_at - env.created_at).total_seconds()
        self._metrics.launched_to_executor_ready.labels(pool=pool.name).observe(max(0.0, latency))

    async def _record(self, pool: PoolWatch, assignment_id: str, name: str) -> FinalizeRecord | bool | None:
        """The finalize record; None when there is none to be had; False when NATS cannot say."""
        if pool.records is None:
            return None
        try:
            return await pool.records.get(assignment_id)
        except SealingError as err:
            log.error("environment %s: its finalize record cannot be opened: %s", name, err)
            return None
        except Exception as err:
            self._metrics.errors.labels(pool=pool.name, kind="nats").inc()
            log.warning("environment %s: its finalize record cannot be read yet: %s", name, err)
            return False

    async def _consumed(self, pool: PoolWatch, assignment_id: str) -> bool:
        """The assignment's finalize record was consumed: a replica reaped its environment."""
        assert pool.records is not None
        try:
            return await pool.records.consumed(assignment_id)
        except Exception as err:
            log.warning("whether %s was reaped elsewhere cannot be told: %s", assignment_id, err)
            return False

    async def _finalize(self, pool: PoolWatch, assignment_id: str, name: str, observation: Observation) -> bool:
        record = await self._record(pool, assignment_id, name)
        if record is False:
            return False
        gone = observation.phase is Phase.GONE
        if not isinstance(record, FinalizeRecord):
            self._metrics.results.labels(pool=pool.name, result="vanished" if gone else "failed").inc()
            log.error("environment %s: no finalize record for its task; Gitea's zombie reaper ends it", name)
            return True
        reason = observation.diagnosis.reason.value if observation.diagnosis else "unknown"
        client = self._gitea.with_credentials(RunnerCredentials(record.runner.uuid, record.runner.token))
        reported = observation.reported.steps if observation.reported is not None else None
        steps = final_steps(len(record.steps), reported, datetime.now(UTC))
        try:
            outcome = await finalize_failed(client, record.task_id, failure_report(observation, record.masks), steps)
        except GiteaError as err:
            self._metrics.errors.labels(pool=pool.name, kind="finalize").inc()
            log.warning("task %s could not be finalized yet: %s", record.task_id, err)
            self._gitea_down = True
            return False
        if outcome is FinalizeOutcome.FINALIZED:
            self._metrics.finalized_failed.labels(pool=pool.name, reason=reason).inc()
            self._metrics.results.labels(pool=pool.name, result="vanished" if gone else "failed").inc()
            if gone:
                log.error("environment %s disappeared; its task %s was finalized failed", name, record.task_id)
        elif outcome is FinalizeOutcome.ALREADY_FINAL:
            # The executor had reported after all (its exit status, or its absence, said otherwise).
            self._metrics.results.labels(pool=pool.name, result="reported").inc()
        else:
            # Runner gone (the task may still run in Gitea, see finalize_failed) or refused for good.
            self._metrics.results.labels(pool=pool.name, result=outcome.value).inc()
        await self._end_cache_registration(pool, record)
        return True
