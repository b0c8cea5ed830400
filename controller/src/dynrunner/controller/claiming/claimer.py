"""A claim loop of one pool: reserve capacity, FetchTask with its armed runner, publish.

Loop: reserve a permit (wait while the pool is full) → FetchTask with the loop's armed
registration, sending the last `tasks_version` (Gitea answers "nothing new" without
scanning jobs when it is current; a version older than `TASKS_VERSION_TRUST_S` is not
sent, see there) → on no task, back off (short first, doubling with jitter up to
`fetchIntervalMaxSeconds`; the loops of a pool take turns, see `PollPacer`; longer after a
slow answer, see `slow_answer_delay`; failing calls back off up to 5 s) and poll again with
the same permit → on a task, log its id, reset the version (another job may be waiting
without a version bump), build the Assignment, seal and publish it at once, then retire the
spent registration from the store; meanwhile the loop registers its next runner. The claim's
stage line travels with the assignment: the launcher that takes it, in whichever replica,
writes it first (`ClaimLine`); the claimer writes it only for a claim it could not publish.

A claimed task is never dropped: a task that cannot be run (bad job key) or whose
assignment JetStream would not take is finalized failed, with the reason in its log.
Claims already taken are finished even during shutdown; a FetchTask in flight is never
cancelled (a client that gives up after Gitea claimed a job strands that job on Gitea
versions before the claim-release fix), so `stop()` lets the current poll return first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from datetime import UTC, datetime
from typing import Protocol

from dynrunner.controller import contract
from dynrunner.controller.assignments.finalize_records import step_names
from dynrunner.controller.claiming.build import ClaimSettings, build_assignment
from dynrunner.controller.claiming.registrations import Registrations
from dynrunner.controller.claiming.registrations_store import ArmedRegistration
from dynrunner.controller.coordination.capacity import Capacity, Reservation
from dynrunner.controller.infra.logs import log_context
from dynrunner.controller.infra.loops import Backoff, Fatal, PollPacer, Stopped, Stopping
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.controller.reporting.finalize import final_steps, finalize_failed
from dynrunner.controller.reporting.stagelog import StageLog, claimed_line
from dynrunner.proto.assignment import SealedAssignment
from dynrunner.proto.gitea import (
    ErrorPage,
    GiteaClient,
    GiteaError,
    RegistrationRefused,
    RunnerRemoved,
    Task,
    Unauthenticated,
)

log = logging.getLogger(__name__)

RETIRE_TIMEOUT_S = 2.0
PUBLISH_CONCURRENCY = 32
"""Claims being published at once, per pool."""
ERROR_BACKOFF_MAX_S = 5.0
"""Longest wait of a claim loop between failing Register/FetchTask calls (Gitea or NATS down)."""
ERROR_PAGES_BEFORE_CONFIRM = 3
"""FetchTasks of one armed runner answered in a row with a front end's 500 page (`ErrorPage`)
before the loop asks Gitea whether the runner still exists (`Registrations.confirm`). Gitea's
own "unregistered runner" behind such a front end looks like any passing failure, and a loop
that only retried would never arm another runner."""
SLOW_ANSWER_FACTOR = 3.0
SLOW_ANSWER_MAX_S = 15.0
HELD_POLL_S = 20.0
"""An empty FetchTask answered this late was held by a long-polling Gitea, not slow."""
TASKS_VERSION_TRUST_S = 10.0
"""How long a claim loop keeps sending the tasks_version Gitea answered after its last scan.
Gitea skips the job scan while the version sent is the latest, and up to 1.26 the latest can
hide waiting jobs: a claim that loses the race for its job to another runner is answered "no
task" with the latest version, and finishing jobs bump nothing (go-gitea/gitea#33492, fixed
by PR #38200 after 1.26). A loop that kept that version would not scan again before some
unrelated bump while jobs wait. So a scan's version is kept only once confirmed (`_empty`:
a lost race is scanned again at the next poll), voided by any claim of the pool seen, and
after this long the loop sends 0: one scan per loop every 10 s at most while idle, costing
Gitea one job query more than the version read every poll costs anyway."""


class Publisher(Protocol):
    async def publish(self, sealed_assignment: SealedAssignment) -> int: ...


def slow_answer_delay(elapsed_s: float) -> float:
    """The least an idle claim loop waits after an empty FetchTask that took `elapsed_s`:
    `SLOW_ANSWER_FACTOR` times as long, at most `SLOW_ANSWER_MAX_S`. A Gitea that answers
    slowly is busy (its database, usually; each FetchTask also costs it a PBKDF2 and, up to
    1.26, a row write): a loop then keeps at most a quarter of its time in FetchTask. Answers
    of a healthy Gitea (milliseconds) leave the pool's pace alone; one held by a long-polling
    Gitea (`HELD_POLL_S` or more) is no sign of load."""
    if elapsed_s >= HELD_POLL_S:
        return 0.0
    return min(SLOW_ANSWER_MAX_S, SLOW_ANSWER_FACTOR * max(0.0, elapsed_s))


def pool_pacer(settings: ClaimSettings) -> PollPacer:
    """The pacer the claim loops of one pool share: polls `fetch_interval_s` apart after a
    claim, growing to `fetch_interval_max_s` while nothing is found."""
    return PollPacer(Backoff(settings.fetch_interval_s, settings.fetch_interval_max_s))


class Claimer:
    def __init__(
        self,
        settings: ClaimSettings,
        *,
        registrations: Registrations,
        capacity: Capacity,
        publisher: Publisher,
        sealer: Sealer,
        metrics: Metrics,
        pacer: PollPacer | None = None,
    ) -> None:
        """`pacer` is shared by the claim loops of one pool (their idle polls take turns)."""
        self.settings = settings
        self.pool = settings.pool
        self._registrations = registrations
        self._capacity = capacity
        self._publisher = publisher
        self._sealer = sealer
        self._metrics = metrics
        self._pacer = pacer or pool_pacer(settings)
        longest = max(ERROR_BACKOFF_MAX_S, settings.fetch_interval_max_s)
        self._error_backoff = Backoff(settings.fetch_interval_s, longest)
        self._tasks_version = 0
        self._tasks_version_at = -math.inf
        """Loop time of the poll that brought `_tasks_version` from a scan."""
        self._tasks_version_claims = 0
        """The pool's claim count (`_claims_seen`) when that poll was sent."""
        self._last_empty: tuple[int, int] | None = None
        """The version and claim count of the last empty answer since a claim (see `_empty`)."""
        self._stopping = Stopping()
        self._claims: set[asyncio.Task[None]] = set()
        self._error_pages = 0
        """FetchTasks of the armed runner answered in a row with an `ErrorPage`."""
        self.consecutive_errors = 0
        self.reached_gitea = False
        """A FetchTask of this loop was answered since the start (for /readyz)."""
        self.last_error = ""
        """The kind and text of the last error (for /readyz)."""

    # -- lifecycle --------------------------------------------------------------------------

    def stop(self) -> None:
        """Claim no more: `run()` returns after the poll in flight; claims taken are finished."""
        self._stopping.set()

    async def run(self) -> None:
        """Claim until `stop()`. Each claimed task is published by a task of its own while
        the loop polls again, so a slow publish does not hold up the next claim."""
        publishing = asyncio.Semaphore(PUBLISH_CONCURRENCY)
        try:
            while not self._stopping.is_set():
                reservation = await self._reserve()
                if reservation is None:
                    return
                try:
                    await publishing.acquire()
                except BaseException:
                    reservation.cancel()
                    raise
                try:
                    claimed = await self._poll_until_claimed()
                except BaseException:
                    reservation.cancel()
                    publishing.release()
                    raise
                if claimed is None:
                    reservation.cancel()
                    publishing.release()
                    return
                task, reg = claimed
                handling = asyncio.create_task(self._handle_claim(task, reg, reservation), name=f"claim-{task.id}")
                self._claims.add(handling)
                handling.add_done_callback(self._claims.discard)
                handling.add_done_callback(lambda _: publishing.release())
                # Never claim with the spent runner again: the next one is registered at once and
                # stored over it (the claim also retires it from the store once published).
                self._registrations.spend()
        finally:
            await self.drain()

    async def drain(self) -> None:
        """Wait for every claim in hand to be published or finalized (shielded: a claim
        already taken is finished even when the claimer is cancelled)."""
        while self._claims:
            await asyncio.shield(asyncio.gather(*list(self._claims), return_exceptions=True))

    # -- polling ---------------------------------------------------------------------------

    async def _poll_until_claimed(self) -> tuple[Task, ArmedRegistration] | None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            try:
                reg = await self._registrations.armed(self._stopping)
            except Stopped:
                return None
            except Fatal:
                raise
            except RegistrationRefused as err:
                await self._until_token_replaced(err)
                continue
            except Exception as err:  # Gitea or the registration store (NATS) failing
                self._error("register", err)
                await self._sleep(self._error_backoff.next())
                continue
            if self._stopping.is_set():
                return None  # stopped while arming (a cancellation lost there must not send a poll)
            client = self._registrations.client(reg)
            started = loop.time()
            sent = self._version_to_send(started)
            claims = self._claims_seen()
            try:
                result = await client.fetch_task(sent, timeout_s=self.settings.request_timeout_s)
            except (RunnerRemoved, Unauthenticated) as err:
                # Gitea dropped the armed runner (its task ended, or an admin deleted it).
                log.info("pool %s: armed runner %s can no longer claim (%s); arming another", self.pool, reg.name, err)
                await self._lost()
                continue
            except GiteaError as err:
                self._metrics.fetch_calls.labels(pool=self.pool, outcome="error").inc()
                self._error("fetch", err)
                if isinstance(err, ErrorPage) and await self._gone_behind_error_pages(reg):
                    await self._lost()
                    continue
                await self._sleep(self._error_backoff.next())
                continue
            self._error_pages = 0
            elapsed = loop.time() - started
            self._metrics.fetch_duration.labels(pool=self.pool).observe(elapsed)
            self.consecutive_errors = 0
            self.reached_gitea = True
            self._error_backoff.reset()
            if result.task is not None:
                with log_context(task_id=result.task.id, pool=self.pool):
                    # First of all: a controller killed from here on leaves this line to find the task by.
                    log.info("claimed task %s as runner %s (id %s)", result.task.id, reg.name, reg.id)
                self._metrics.fetch_calls.labels(pool=self.pool, outcome="task").inc()
                self._metrics.claim_latency.labels(pool=self.pool).observe(elapsed)
                self._tasks_version = 0
                self._last_empty = None
                self._pacer.claimed()
                return result.task, reg
            self._metrics.fetch_calls.labels(pool=self.pool, outcome="empty").inc()
            self._empty(sent, result.tasks_version, started, claims)
            await self._sleep(max(self._pacer.delay(loop.time()), slow_answer_delay(elapsed)))
        return None

    def _empty(self, sent: int, version: int, started: float, claims: int) -> None:
        """Keep the version of an empty answer, trusted from `started` if it can be.

        On Gitea ≤ 1.26 a scan answered "no task" proves nothing while jobs wait: a claim that
        lost the race for its job — to a loop of this pool, of another replica, to another
        controller — gets that answer, with the latest version, and the next job stays
        waiting behind it. So a scan's version is trusted only once a second answer confirmed
        it: the same version, with no claim of the pool seen between the two polls. A loop that
        lost a race scans again at its next poll; an idle loop is confirmed by the scan that
        renews its trust (the last answer said the same), at no cost. An answer with the
        version sent is Gitea's fast path and changes nothing."""
        if sent and version == sent:
            self._metrics.tasks_version_fast_path.labels(pool=self.pool).inc()
        elif self._last_empty == (version, claims):
            self._tasks_version_at = started
            self._tasks_version_claims = claims
        else:
            self._tasks_version_at = -math.inf  # the next poll scans again
        self._tasks_version = version
        self._last_empty = (version, claims)

    def _claims_seen(self) -> int:
        """Claims of the pool seen so far: by its loops here, and by every replica's, as the
        pool's shared permits show them bound."""
        ledger = self._capacity.ledger
        return self._pacer.claims + (ledger.bound_seen if ledger is not None else 0)

    def _version_to_send(self, now: float) -> int:
        """The stored tasks_version; 0 (scan) once it is `TASKS_VERSION_TRUST_S` old, or once a
        claim of the pool (any replica's) was seen since the poll that brought it: the two may
        have raced for one job, and Gitea ≤ 1.26 answered the loser "no task" with the latest
        version — while the next job waits (another pool or controller is what the time bound
        is for)."""
        stale = now - self._tasks_version_at >= TASKS_VERSION_TRUST_S
        if stale or self._claims_seen() != self._tasks_version_claims:
            self._tasks_version = 0
        return self._tasks_version

    async def _lost(self) -> None:
        await self._registrations.lost()
        self._tasks_version = 0
        self._error_pages = 0

    async def _gone_behind_error_pages(self, reg: ArmedRegistration) -> bool:
        """After `ERROR_PAGES_BEFORE_CONFIRM` error pages in a row for `reg`, whether Gitea
        still knows it (asked again after as many more)."""
        self._error_pages += 1
        if self._error_pages < ERROR_PAGES_BEFORE_CONFIRM:
            return False
        self._error_pages = 0
        try:
            return not await self._registrations.confirm(reg)
        except GiteaError as err:
            self._error("confirm", err)
            return False

    async def _until_token_replaced(self, err: RegistrationRefused) -> None:
        """Gitea refused the registration token: registering again with it cannot succeed, so
        wait for another one (`registration_token`), or for `stop()`."""
        self.consecutive_errors += 1
        self._metrics.errors.labels(pool=self.pool, kind="register").inc()
        self.last_error = f"register: {err}"
        replaced = asyncio.create_task(self._registrations.token.replaced(), name=f"token-{self.pool}")
        stopping = asyncio.create_task(self._stopping.wait(), name=f"stop-{self.pool}")
        try:
            await asyncio.wait({replaced, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (replaced, stopping):
                task.cancel()
            await asyncio.gather(replaced, stopping, return_exceptions=True)

    # -- one claim ---------------------------------------------------------------------------

    async def _handle_claim(self, task: Task, reg: ArmedRegistration, reservation: Reservation) -> None:
        """Build, seal and publish at once: until JetStream acknowledges the assignment, a
        controller killed loses the claim (docs/operations.md, "Known windows"), so nothing
        else is awaited before. The spent runner leaves the registration store after."""
        assignment_id = str(uuid.uuid4())
        claimed_at = datetime.now(UTC)
        with log_context(assignment_id=assignment_id, task_id=task.id, pool=self.pool):
            client = self._registrations.client(reg)
            line = claimed_line(self.pool, reg.name, reg.id, reg.labels)
            try:
                try:
                    assignment = build_assignment(
                        task, assignment_id=assignment_id, claimed_at=claimed_at, runner=reg, settings=self.settings
                    )
                except Exception as err:  # a ContractError, or anything else: the task is never dropped
                    reason = str(err)
                    if not isinstance(err, contract.ContractError):
                        log.exception("task %s: the assignment could not be built", task.id)
                        reason = f"the controller could not prepare the job: {type(err).__name__}: {err}"
                    await self._fail(client, task, reason, "invalid-task")
                    reservation.cancel()
                    return
                try:
                    await self._publisher.publish(self._sealer.seal_assignment(assignment))
                except Exception as err:  # PublishError, or a sealing failure: either way, not queued
                    self._metrics.errors.labels(pool=self.pool, kind="publish").inc()
                    reason = f"the controller could not queue the job for launch: {err}"
                    await StageLog(client, task.id, next_index=0).write(line)  # nobody else writes its log
                    await self._fail(client, task, reason, "publish")
                    reservation.cancel()
                    return
                reservation.bind(assignment_id)  # the launcher writes its claim line: not one write after this
            except BaseException:
                if not reservation.done:
                    reservation.cancel()
                raise
            finally:
                await self._retire(reg)

    async def _retire(self, reg: ArmedRegistration) -> None:
        """The spent runner leaves the registration store, unless the loop stored its next
        runner over it already. Until then a restarted controller would poll with it: Gitea
        answers such a runner "no task" while its task runs, and "unauthenticated" once the
        task ended and Gitea deleted it, when the loop arms another (docs/operations.md)."""
        for attempt in range(3):
            try:
                await asyncio.wait_for(self._registrations.forget(reg), RETIRE_TIMEOUT_S)
                return
            except Exception as err:
                self._error("registration-store", err)
                await asyncio.sleep(0.2 * (attempt + 1))
        log.error("pool %s: could not remove spent runner %s from the store", self.pool, reg.name)

    async def _fail(self, client: GiteaClient, task: Task, reason: str, kind: str) -> None:
        """End a task none of whose steps ran: each is reported skipped."""
        self._metrics.finalized_failed.labels(pool=self.pool, reason=kind).inc()
        steps = final_steps(len(step_names(task.workflow_payload)), (), datetime.now(UTC))
        try:
            await finalize_failed(client, task.id, reason, steps)
        except GiteaError as err:
            # Gitea stays unreachable: its zombie reaper fails the task after ZOMBIE_TASK_TIMEOUT.
            self._error("finalize", err)
            log.error("task %s could not be finalized (%s); Gitea will time it out", task.id, err)

    # -- helpers ---------------------------------------------------------------------------

    def _error(self, kind: str, err: BaseException) -> None:
        self.consecutive_errors += 1
        self._metrics.errors.labels(pool=self.pool, kind=kind).inc()
        text = str(err) or type(err).__name__  # a bare TimeoutError says nothing
        self.last_error = f"{kind}: {text}"
        log.warning("pool %s: %s failed: %s", self.pool, kind, text)

    async def _sleep(self, seconds: float) -> None:
        await self._stopping.sleep(seconds)

    async def _reserve(self) -> Reservation | None:
        """A reserved permit, or None when `stop()` came first."""
        waiter = asyncio.create_task(self._capacity.reserve(self._stopping), name=f"reserve-{self.pool}")
        stopper = asyncio.create_task(self._stopping.wait(), name=f"stop-{self.pool}")
        try:
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError, Stopped):
                    await waiter
        if waiter.cancelled() or isinstance(waiter.exception(), Stopped):
            return None  # a cancellation lost inside the wait still ends it, on the flag
        reservation = waiter.result()
        if self._stopping.is_set():
            reservation.cancel()
            return None
        return reservation
