"""The launcher of one pool: JetStream deliveries → environments.

For each delivery: open the sealed assignment — refusing (dropping, logging and counting,
never running or reporting anything) one that does not authenticate with the controller's
key or belongs to another pool — take its capacity permit, write the task's finalize
record (`finalize_records`: what finalizing it needs, kept outside the environment), and
create the environment idempotently, keeping the delivery alive (`in_progress`) and
heartbeating the task meanwhile. The delivery is acknowledged as soon as the environment's
objects exist, and its start is handed to `Starts` (stage lines and heartbeats until the
executor runs): a launch slot is held for the create only, never for an image pull. A
failure naks the delivery for another attempt after a backoff; the last attempt finalizes
the task failed with the reason and terminates the message.

A redelivered assignment whose environment exists already (the previous launcher died
between creating and acknowledging) is completed (`create` is idempotent), acknowledged and
its start followed: one the earlier attempt never started is started now. The environment
records the delivery's stream sequence, so until then the reaper leaves it alone.
Replays are refused: the launch record (`launched`) names the stream message each assignment
was launched from, and any other message of that assignment is dropped; so is one whose
deadline has passed.

The executor reports to the configured Gitea: the URL in the assignment is replaced by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Protocol

from dynrunner.controller.assignments.finalize_records import FinalizeRecord, FinalizeRecords, step_names
from dynrunner.controller.assignments.launched import LaunchRecord
from dynrunner.controller.backends.base import Backend, JobRefused
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.logs import log_context
from dynrunner.controller.infra.loops import Backoff, Stopping
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import ForgedAssignment, Sealer, SealingError
from dynrunner.controller.launching.starts import Starts, end_cancelled
from dynrunner.controller.reporting.finalize import final_steps, finalize_failed
from dynrunner.controller.reporting.stagelog import HEARTBEAT_INTERVAL_S, ClaimLine, Heartbeat, TaskEnded
from dynrunner.proto.assignment import Assignment, SealedAssignment
from dynrunner.proto.gitea import GiteaClient, RunnerCredentials

log = logging.getLogger(__name__)

LAUNCH_CONCURRENCY = 16
STALE_CLAIM_S = 60.0
"""A first delivery claimed longer ago than this is checked with Gitea before it is launched
(normally a launch follows its claim within milliseconds)."""
NAK_BACKOFF = Backoff(initial=1.0, maximum=60.0, jitter=0.2)


class Delivery(Protocol):
    """What the launcher needs of `assignments.Delivery`."""

    assignment: SealedAssignment
    num_delivered: int
    max_deliver: int
    stream_seq: int

    @property
    def is_last_attempt(self) -> bool: ...
    @property
    def exhausted(self) -> bool: ...
    def keep_alive(self, interval_s: float | None = None) -> contextlib.AbstractAsyncContextManager[None]: ...
    async def ack(self) -> None: ...
    async def nak(self, delay_s: float | None = None) -> None: ...
    async def term(self) -> None: ...


class DeliverySource(Protocol):
    def deliveries(
        self, pool: str, batch: int | Callable[[], int] = 1, stopping: Stopping | None = None
    ) -> AsyncIterator[Delivery]: ...


def nak_delay(num_delivered: int) -> float:
    """Backoff before the next attempt of a failed launch: 1 s, 2 s, 4 s, … up to 60 s."""
    return dataclasses.replace(NAK_BACKOFF, attempts=max(0, num_delivered - 1)).peek()


class Launcher:
    def __init__(
        self,
        pool: str,
        *,
        backend: Backend,
        source: DeliverySource,
        sealer: Sealer,
        record: LaunchRecord,
        records: FinalizeRecords,
        gitea: GiteaClient,
        capacity: Capacity,
        metrics: Metrics,
        concurrency: int = LAUNCH_CONCURRENCY,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        on_released: Callable[[str], None] = lambda _: None,
    ) -> None:
        """`on_released(assignment_id)`: a launch or a start follower let go of an environment
        (the reaper, which leaves those alone meanwhile, looks at it again)."""
        self.pool = pool
        self._backend = backend
        self._source = source
        self._sealer = sealer
        self._record = record
        self._records = records
        self._gitea = gitea
        self._capacity = capacity
        self._metrics = metrics
        self._concurrency = concurrency
        self._heartbeat_interval_s = heartbeat_interval_s
        self._on_released = on_released
        self._launches: set[asyncio.Task[None]] = set()
        self._stopping = Stopping()
        self.launching: set[str] = set()
        """Assignment ids being launched right now."""
        self.starts = Starts(
            pool,
            backend=backend,
            gitea=gitea,
            records=records,
            capacity=capacity,
            metrics=metrics,
            heartbeat_interval_s=heartbeat_interval_s,
            on_end=on_released,
        )

    def busy(self) -> set[str]:
        """Assignment ids being launched or whose start is followed (the reaper leaves them alone)."""
        return self.launching | self.starts.ids()

    def stop(self) -> None:
        """Pull no more: `run()` returns once the pull in flight answered or expired (cancel it
        too, to end an idle pull at once)."""
        self._stopping.set()
        self.starts.stop()

    @property
    def stopping(self) -> Stopping:
        """Set by `stop()` (`supervise` restarts nothing once it is)."""
        return self._stopping

    async def run(self) -> None:
        """Pull and launch until `stop()` or cancelled; launches in hand are finished first
        (`drain`). A pull takes as many assignments as there are free launch slots."""
        slots = asyncio.Semaphore(self._concurrency)
        free = [self._concurrency]

        def release(_: object) -> None:
            free[0] += 1
            slots.release()

        deliveries = self._source.deliveries(self.pool, batch=lambda: free[0] + 1, stopping=self._stopping)
        try:
            while not self._stopping.is_set():
                await slots.acquire()
                free[0] -= 1
                try:
                    delivery = await anext(deliveries)
                except BaseException as err:
                    release(None)
                    if isinstance(err, StopAsyncIteration):
                        return
                    raise
                name = f"launch-{delivery.assignment.assignment_id}"
                launch = asyncio.create_task(self._launch(delivery), name=name)
                self._launches.add(launch)
                launch.add_done_callback(self._launches.discard)
                launch.add_done_callback(release)
        finally:
            if isinstance(deliveries, AsyncGenerator):
                await deliveries.aclose()
            await self.drain()
            await self.starts.aclose()

    async def drain(self) -> None:
        """Wait for launches in hand (shielded from the caller's cancellation)."""
        while self._launches:
            await asyncio.shield(asyncio.gather(*list(self._launches), return_exceptions=True))

    # -- one delivery ------------------------------------------------------------------------

    async def _launch(self, delivery: Delivery) -> None:
        """One delivery, as a task nobody awaits: every failure is logged here (an unanswered
        delivery simply comes back after ack-wait)."""
        sealed = delivery.assignment
        with log_context(assignment_id=sealed.assignment_id, task_id=sealed.task_id, pool=self.pool):
            try:
                assignment = self._open(sealed)
            except SealingError as err:
                try:
                    if isinstance(err, ForgedAssignment):
                        await self._refuse(delivery, "forged", str(err))
                    else:
                        await self._unopenable(delivery, err)
                except Exception:
                    log.exception("answering the delivery of an unopenable assignment failed")
                return
            try:
                admitted = await self._admit(delivery, assignment)
            except Exception:
                log.exception("answering the delivery of %s failed", assignment.assignment_id)
                return
            if not admitted:
                return
            self._capacity.adopt(assignment.assignment_id)
            self.launching.add(assignment.assignment_id)
            try:
                await self._launch_unsealed(delivery, assignment)
            except Exception:
                log.exception("launch of %s failed unexpectedly", assignment.assignment_id)
            finally:
                self.launching.discard(assignment.assignment_id)
                self._on_released(assignment.assignment_id)

    async def _admit(self, delivery: Delivery, assignment: Assignment) -> bool:
        """Launch (or resume) only the message this assignment is recorded for, before its
        deadline; refuse replays and expired messages, acknowledge one already launched."""
        assignment_id, seq = assignment.assignment_id, delivery.stream_seq
        if assignment.deadline is not None and assignment.deadline <= datetime.now(UTC):
            why = f"assignment {assignment_id} passed its deadline ({assignment.deadline.isoformat()})"
            await self._refuse(delivery, "expired", f"{why}; Gitea ends its task")
            return False
        try:
            verdict, found = await self._record.begin(assignment_id, seq)
        except Exception as err:
            # Unverifiable is not launchable: try again once the record answers.
            self._metrics.errors.labels(pool=self.pool, kind="nats").inc()
            log.warning("the launch record cannot be read (%s); the assignment is tried again", _describe(err))
            await delivery.nak(nak_delay(delivery.num_delivered))
            return False
        if verdict == "replayed":
            assert found is not None
            why = (
                f"assignment {assignment_id} was launched from stream message {found.stream_seq}; "
                f"stream message {seq} is a replay of it"
            )
            await self._refuse(delivery, "replayed", why)
            return False
        if verdict == "answered":
            log.info("redelivered after its launch was over; acknowledging")
            await self._acknowledge(delivery)
            return False
        return True

    async def _done(self, delivery: Delivery, assignment_id: str) -> None:
        """Record the launch as over (best effort: while the record says launching, copies of the
        message are refused all the same)."""
        try:
            await self._record.done(assignment_id, delivery.stream_seq)
        except Exception as err:
            self._metrics.errors.labels(pool=self.pool, kind="nats").inc()
            log.warning("the launch record could not be updated: %s", _describe(err))

    async def _launch_unsealed(self, delivery: Delivery, assignment: Assignment) -> None:
        client = self._gitea.with_credentials(RunnerCredentials(assignment.runner.uuid, assignment.runner.token))
        task_id = assignment.task.id
        if delivery.exhausted:
            reason = f"the {self._backend.name} environment could not be created in {delivery.max_deliver} attempts"
            await self._give_up(delivery, assignment, client, reason)
            return
        heartbeat = Heartbeat(client, task_id, interval_s=self._heartbeat_interval_s)
        record = FinalizeRecord.of(assignment)
        claim: ClaimLine | None = None
        """The claim's line, for a launch that creates the environment: written first, by this
        launch (an earlier attempt, here or in another replica, wrote at most this line)."""
        try:
            async with delivery.keep_alive():
                existing = await self._backend.find(assignment.assignment_id)
                if existing is not None:
                    log.info("environment %s exists already (redelivery); completing and acknowledging", existing.name)
                else:
                    claim_age = (datetime.now(UTC) - assignment.claimed_at).total_seconds()
                    if delivery.num_delivered > 1 or claim_age > STALE_CLAIM_S:
                        # An earlier attempt may have run the job already and its environment
                        # been reaped since: only a task still running in Gitea is launched.
                        await heartbeat.beat()
                    claim = ClaimLine.of(assignment, client)
                # Otherwise the claim just refreshed the task in Gitea: the first beat is due
                # after one interval (a launch that fast costs Gitea nothing extra).
                heartbeat.start()
                await self._records.put(record)
                env = await self._backend.create(assignment, stream_seq=delivery.stream_seq)
                if heartbeat.ended is not None:
                    raise heartbeat.ended
                if existing is None:
                    self._metrics.claimed_to_launched.labels(pool=self.pool).observe(
                        (datetime.now(UTC) - assignment.claimed_at).total_seconds()
                    )
        except TaskEnded as ended:
            await heartbeat.stop()
            if existing is None and await self._reaped_already(assignment.assignment_id):
                if claim is not None:
                    claim.discard()
                await self._over_already(delivery, assignment.assignment_id)
            else:
                await self._ended_before_start(delivery, assignment, client, ended, claim)
        except asyncio.CancelledError:
            heartbeat.cancel()
            if claim is not None:
                claim.discard()
            raise
        except Exception as err:
            await heartbeat.stop()
            self._metrics.errors.labels(pool=self.pool, kind="launch").inc()
            if isinstance(err, JobRefused):
                await self._give_up(delivery, assignment, client, str(err), claim)
            elif delivery.is_last_attempt:
                reason = (
                    f"the {self._backend.name} environment could not be created "
                    f"(attempt {delivery.num_delivered} of {delivery.max_deliver}): {_describe(err)}"
                )
                await self._give_up(delivery, assignment, client, reason, claim)
            else:
                if claim is not None:
                    await claim.aclose()  # the next attempt writes it, maybe in another replica
                delay = nak_delay(delivery.num_delivered)
                log.warning(
                    "launch attempt %d/%d failed, retrying in %.0fs: %s",
                    delivery.num_delivered,
                    delivery.max_deliver,
                    delay,
                    _describe(err),
                )
                await delivery.nak(delay)
        else:
            # Followed from here on, with the same heartbeat (no gap, no extra beat).
            self.starts.follow(env, record=record, heartbeat=heartbeat, claim=claim)
            await self._done(delivery, assignment.assignment_id)
            await self._acknowledge(delivery)

    async def _acknowledge(self, delivery: Delivery) -> None:
        """The environment exists (its executor may be running the job): acknowledge. An ack
        NATS does not confirm (down, restarting) is not a failed launch — nak'ing it, or on
        the last attempt finalizing the task and removing the environment, would stop a job
        that runs. The delivery comes back after ack-wait, finds the environment, and is
        acknowledged then."""
        try:
            await delivery.ack()
        except Exception as err:
            self._metrics.errors.labels(pool=self.pool, kind="nats").inc()
            log.warning(
                "the environment exists but NATS did not confirm the ack (%s); the assignment comes back "
                "after ack-wait and is acknowledged then",
                _describe(err),
            )

    async def _give_up(
        self,
        delivery: Delivery,
        assignment: Assignment,
        client: GiteaClient,
        reason: str,
        claim: ClaimLine | None = None,
    ) -> None:
        """Last attempt failed: tell the user why, remove what was made, never deliver again."""
        self._metrics.finalized_failed.labels(pool=self.pool, reason="launch").inc()
        await _claim_first(assignment, client, claim)
        steps = final_steps(len(step_names(assignment.task.workflow_payload)), (), datetime.now(UTC))
        await finalize_failed(client, assignment.task.id, reason, steps)  # no step ran
        await self._remove(assignment.assignment_id)
        await self._done(delivery, assignment.assignment_id)
        await delivery.term()
        self._capacity.release(assignment.assignment_id)

    async def _reaped_already(self, assignment_id: str) -> bool:
        """Its finalize record was consumed: its environment was reaped after the job ended
        (or its start was ended after a cancel), so this delivery came after all of it."""
        try:
            return await self._records.consumed(assignment_id)
        except Exception as err:
            self._metrics.errors.labels(pool=self.pool, kind="nats").inc()
            log.warning("whether %s was reaped cannot be told: %s", assignment_id, _describe(err))
            return False

    async def _over_already(self, delivery: Delivery, assignment_id: str) -> None:
        """A delivery after the job was run and reaped (its launcher died before the ack): its
        result was counted when it was reaped; nothing is run, reported or counted again."""
        log.info("delivered again after its job ended and its environment was reaped; not run again")
        await self._done(delivery, assignment_id)
        await self._acknowledge(delivery)
        self._capacity.release(assignment_id)

    async def _ended_before_start(
        self, delivery: Delivery, assignment: Assignment, client: GiteaClient, ended: TaskEnded, claim: ClaimLine | None
    ) -> None:
        """The run was cancelled (or Gitea gave up on the task) before the executor started."""
        log.info("%s; not starting it", ended)
        if ended.result is not None:  # else the runner is gone: nothing can be written
            await _claim_first(assignment, client, claim)
        elif claim is not None:
            await claim.aclose()
        await end_cancelled(client, assignment.task.id, ended)
        self._metrics.results.labels(pool=self.pool, result="cancelled").inc()
        await self._remove(assignment.assignment_id)
        await self._done(delivery, assignment.assignment_id)
        await delivery.ack()
        self._capacity.release(assignment.assignment_id)

    def _open(self, sealed: SealedAssignment) -> Assignment:
        """The authenticated assignment, bound to this pool and to the configured Gitea."""
        assignment = self._sealer.unseal_assignment(sealed)
        if assignment.pool != self.pool:
            raise ForgedAssignment(
                f"assignment {assignment.assignment_id} of pool {assignment.pool!r} was delivered to pool {self.pool!r}"
            )
        return assignment.replace(gitea_url=self._gitea.base_url)

    async def _refuse(self, delivery: Delivery, reason: str, why: str) -> None:
        """Never run, never report: a message that proves nothing about its origin (or was
        already used) gets no answer but its removal from the stream."""
        self._metrics.refused.labels(pool=self.pool, reason=reason).inc()
        log.error("assignment refused (%s) and dropped, nothing was run: %s", reason, why)
        await delivery.term()

    async def _unopenable(self, delivery: Delivery, err: SealingError) -> None:
        """Without the key nothing can be reported to Gitea: retry (another replica may hold
        the key) and drop it after the last attempt; Gitea's zombie reaper ends the task."""
        self._metrics.errors.labels(pool=self.pool, kind="sealing").inc()
        if delivery.is_last_attempt or delivery.exhausted:
            log.error("assignment cannot be unsealed and is dropped: %s", err)
            await delivery.term()
        else:
            log.error("assignment cannot be unsealed (attempt %d): %s", delivery.num_delivered, err)
            await delivery.nak(nak_delay(delivery.num_delivered))

    async def _remove(self, assignment_id: str) -> None:
        """Delete what was made for the assignment (its task is finalized)."""
        try:
            env = await self._backend.find(assignment_id)
            if env is not None:
                await self._backend.delete(env)
        except Exception as err:
            log.warning("could not remove the environment of %s: %s (the reaper will)", assignment_id, err)
            return
        try:
            await self._records.delete(assignment_id)
        except Exception as err:
            log.warning("the finalize record of %s stays until it expires: %s", assignment_id, err)


async def _claim_first(assignment: Assignment, client: GiteaClient, claim: ClaimLine | None) -> None:
    """Before a task is finalized here: the claim's line first, unless written already (it
    goes to index 0 only, so a line an earlier attempt wrote is not written twice)."""
    line = claim or ClaimLine.of(assignment, client)
    await line.write()
    await line.aclose()


def _describe(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
