"""The reaper: finished environments are deleted, failed ones finalized, orphans collected.

Every sweep lists each pool's environments and observes them:

* succeeded (the executor finalized its task) → delete the environment, release the permit;
* failed (ended — or stuck past its deadline — before the executor finalized) → finalize the
  task failed with the diagnosis in the job log, then delete it and release the permit;
  when Gitea cannot be reached the environment stays, and the next sweep tries again (after
  one such failure a round finalizes nothing more, but still reaps what needs no Gitea);
* gone (it vanished under us) → release the permit; without the environment there are no
  credentials to report with, so Gitea's zombie reaper ends that task.

A failed environment whose assignment JetStream still holds unacknowledged is left alone: the
launch that made it was interrupted (a controller killed between creating it and starting
its executor), and the assignment's redelivery resumes it.

Less often it removes orphans (leftovers of interrupted creates) and trims capacity
permits recovered at start to what JetStream still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from dynrunner.controller.backends.base import Environment, LegacyBackend, Observation, Phase
from dynrunner.controller.capacity import Capacity
from dynrunner.controller.finalize import FinalizeOutcome, finalize_failed
from dynrunner.controller.logs import log_context
from dynrunner.controller.metrics import Metrics
from dynrunner.proto.assignment import Assignment
from dynrunner.proto.gitea import GiteaClient, GiteaError, RunnerCredentials
from dynrunner.proto.masking import Masker, add_mask_values, assignment_values

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
ORPHAN_INTERVAL_S = 60.0


@dataclass
class PoolWatch:
    """What the reaper needs of one pool."""

    name: str
    backend: LegacyBackend
    capacity: Capacity
    launching: Callable[[], Collection[str]]
    pending: Callable[[], Awaitable[int]] | None = None
    """JetStream's count of the pool's unacknowledged assignments (to trim recovered permits)."""
    unacknowledged: Callable[[Environment], Awaitable[bool]] | None = None
    """Whether JetStream still holds the environment's assignment unacknowledged (by the stream
    sequence the environment recorded): its launch was interrupted and will be resumed."""


def mask_secrets(text: str, assignment: Assignment) -> str:
    """`text` (the executor's output) masked as the executor masks the job log, with the same
    masker: every credential the assignment carries, and any value an `::add-mask::` line in
    `text` registers, in every form the masker knows (each line of a multi-line value, base64,
    JSON and URL escapes, ...)."""
    masker = Masker(assignment_values(assignment))
    for value in add_mask_values(text):
        masker.add(value)
    return masker.mask(text)


def failure_report(observation: Observation, assignment: Assignment) -> str:
    """The lines the user reads: the diagnosis, then the executor's last output (masked)."""
    diagnosis = observation.diagnosis
    if diagnosis is None:
        return "the job's environment ended without its executor reporting a result"
    text = f"{diagnosis.message} [{diagnosis.reason.value}]"
    if diagnosis.detail:
        text += "\nlast lines of the executor's output:\n" + mask_secrets(diagnosis.detail, assignment)
    return text


class Reaper:
    def __init__(
        self,
        pools: Iterable[PoolWatch],
        *,
        gitea: GiteaClient,
        metrics: Metrics,
        interval_s: float = SWEEP_INTERVAL_S,
        orphan_interval_s: float = ORPHAN_INTERVAL_S,
    ) -> None:
        self._pools = list(pools)
        self._gitea = gitea
        self._metrics = metrics
        self._interval_s = interval_s
        self._orphan_interval_s = orphan_interval_s
        self._seen: dict[str, set[str]] = {p.name: set() for p in self._pools}
        self._ready_noted: dict[str, set[str]] = {p.name: set() for p in self._pools}
        self._awaiting_redelivery: dict[str, set[str]] = {p.name: set() for p in self._pools}
        self._gitea_down = False
        """Set when a finalize outlasted the client's retries in this round: the other failed
        environments wait for the next round instead of each spending the retry budget."""
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_orphans = loop.time() + self._orphan_interval_s
        while not self._stopping.is_set():
            self._gitea_down = False
            for pool in self._pools:
                try:
                    await self.sweep(pool)
                except Exception as err:
                    self._metrics.errors.labels(pool=pool.name, kind="reaper").inc()
                    log.exception("pool %s: sweep failed: %s", pool.name, err)
            if loop.time() >= next_orphans:
                next_orphans = loop.time() + self._orphan_interval_s
                for pool in self._pools:
                    await self.collect(pool)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)

    async def sweep(self, pool: PoolWatch) -> None:
        envs = await pool.backend.list_owned()
        launching = set(pool.launching())
        present = {env.assignment_id for env in envs}
        for env in envs:
            if env.assignment_id in launching:
                continue
            with log_context(assignment_id=env.assignment_id, task_id=env.task_id, pool=pool.name):
                try:
                    await self._handle(pool, env)
                except Exception as err:  # one environment's trouble must not hold up the others
                    self._metrics.errors.labels(pool=pool.name, kind="reaper").inc()
                    log.exception("environment %s: reaping failed: %s", env.name, err)
        # An environment seen before that vanished outside our control (and was not reaped here).
        seen = self._seen[pool.name]
        for assignment_id in seen - present - launching:
            if pool.capacity.release(assignment_id):
                self._metrics.results.labels(pool=pool.name, result="vanished").inc()
                log.error("environment of %s disappeared; Gitea's zombie reaper will end its task", assignment_id)
        self._seen[pool.name] = present
        self._ready_noted[pool.name] &= present
        self._awaiting_redelivery[pool.name] &= present

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

    async def _handle(self, pool: PoolWatch, env: Environment) -> None:
        observation = await pool.backend.observe(env)
        self._note_ready(pool, env, observation)
        if not observation.phase.finished:
            pool.capacity.adopt(env.assignment_id)
            return
        if observation.phase is Phase.FAILED:
            if await self._redelivery_pending(pool, env):
                pool.capacity.adopt(env.assignment_id)
                return  # the launch was interrupted; its redelivery resumes it (or gives up)
            if self._gitea_down or not await self._finalize(pool, env, observation):
                return  # Gitea unreachable: keep the environment (and its credentials) for the next sweep
        elif observation.phase is Phase.SUCCEEDED:
            self._metrics.results.labels(pool=pool.name, result="reported").inc()
        else:
            self._metrics.results.labels(pool=pool.name, result="vanished").inc()
            log.error("environment %s is gone before its task was finalized", env.name)
        if observation.phase is not Phase.GONE:
            await pool.backend.delete(env)
        self._metrics.job_duration.labels(pool=pool.name).observe(
            max(0.0, (datetime.now(UTC) - env.created_at).total_seconds())
        )
        pool.capacity.release(env.assignment_id)
        log.info("environment %s reaped (%s)", env.name, observation.phase.value)

    async def _redelivery_pending(self, pool: PoolWatch, env: Environment) -> bool:
        """The environment's assignment is still unacknowledged in JetStream: the launch that
        made it was interrupted (e.g. the controller was killed before starting the executor),
        and the message's redelivery resumes it, or finalizes the task after the last attempt.
        Finalizing it here would fail a job that is about to run. When NATS cannot tell, the
        environment waits for the next sweep."""
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

    async def _finalize(self, pool: PoolWatch, env: Environment, observation: Observation) -> bool:
        try:
            assignment = await pool.backend.load_assignment(env)
        except Exception as err:
            log.error("environment %s: its assignment cannot be read (%s); Gitea will time the task out", env.name, err)
            return True
        reason = observation.diagnosis.reason.value if observation.diagnosis else "unknown"
        client = self._gitea.with_credentials(RunnerCredentials(assignment.runner.uuid, assignment.runner.token))
        try:
            outcome = await finalize_failed(client, assignment.task.id, failure_report(observation, assignment))
        except GiteaError as err:
            self._metrics.errors.labels(pool=pool.name, kind="finalize").inc()
            log.warning("task %s could not be finalized yet: %s", assignment.task.id, err)
            self._gitea_down = True
            return False
        if outcome is FinalizeOutcome.FINALIZED:
            self._metrics.finalized_failed.labels(pool=pool.name, reason=reason).inc()
            self._metrics.results.labels(pool=pool.name, result="failed").inc()
        else:
            # The executor had reported after all (its exit status said otherwise).
            self._metrics.results.labels(pool=pool.name, result="reported").inc()
        return True
