"""What stops steps from outside, and the watch over a running step.

Gitea's cancellation (or the task ended under the job, or reporting failed for good), the
environment shutting down (SIGTERM), the job's `timeout-minutes`, a step's
`timeout-minutes` and the assignment's deadline. `JobSignals` keeps the job-level state
(status `cancelled`, aborted, timed out) and `supervise` watches one running step: when a
signal arrives it decides whether the step stops, sets the step's stop event and waits for
the handler to end, cancelling it if it does not stop within the graces.

On cancellation the running step's `if:` is evaluated again (GitHub's rule): a step whose
condition still holds (`always()`, `cancelled()`) keeps running. Steps of a composite
action are watched the same way, each with its own condition, and also stop when the step
that called the action is stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dynrunner.executor.contexts import JobContexts
from dynrunner.executor.reporter import Reporter
from dynrunner.executor.steps.base import Stop, StopSignal
from dynrunner.executor.steps.process import StopTimings


@dataclass(slots=True)
class Deadlines:
    """Loop-clock instants. `job` moves to the cleanup budget once the job timed out."""

    job: float
    job_minutes: float
    hard: float | None = None
    job_timed_out: bool = False


class JobSignals:
    def __init__(
        self,
        *,
        reporter: Reporter,
        contexts: JobContexts,
        deadlines: Deadlines,
        timings: StopTimings,
        cleanup_s: float,
        shutdown: asyncio.Event,
    ) -> None:
        self.reporter = reporter
        self.contexts = contexts
        self.deadlines = deadlines
        self.timings = timings
        self.cleanup_s = cleanup_s
        self.shutdown = shutdown
        self.aborted = False
        self.cancel_seen = False
        self._cancel_wait = asyncio.create_task(reporter.cancelled.wait(), name="job-cancel-watch")
        self._shutdown_wait = asyncio.create_task(shutdown.wait(), name="job-shutdown-watch")

    def close(self) -> None:
        self._cancel_wait.cancel()
        self._shutdown_wait.cancel()

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    # -- job-level state ------------------------------------------------------------------

    def note_cancel(self) -> None:
        """React once to the reporter's `cancelled`. Gitea ended the task (a user's cancel,
        answered as such, or on Gitea 1.24-1.26 seen as the runner deleted under the job; a
        reaper): the job is cancelled, so its always()/cancelled() steps still run. Reporting
        failed for another reason: the job is aborted."""
        if self.cancel_seen or not self.reporter.cancelled.is_set():
            return
        self.cancel_seen = True
        if self.reporter.ended_by_gitea:
            self.contexts.status = "cancelled"
            self.reporter.log("##[error]The operation was canceled.")
        else:
            self.aborted = True

    def time_out_job(self) -> None:
        if not self.deadlines.job_timed_out:
            self.deadlines.job_timed_out = True
            self.deadlines.job = self.now() + self.cleanup_s
            if self.contexts.status != "cancelled":
                self.contexts.status = "failure"
            minutes = f"{self.deadlines.job_minutes:g}"
            self.reporter.log(
                f"##[error]The job running on runner {self.contexts.runner.get('name', '')} has exceeded the "
                f"maximum execution time of {minutes} minutes."
            )

    def note_shutdown(self) -> bool:
        if self.shutdown.is_set() and not self.aborted:
            self.aborted = True
            self.contexts.status = "failure"
            self.reporter.log("##[error]The runner's environment is shutting down; the job was stopped.")
        return self.shutdown.is_set()

    def past_hard_deadline(self) -> bool:
        hard = self.deadlines.hard
        if hard is not None and self.now() >= hard and not self.aborted:
            self.aborted = True
            self.contexts.status = "failure"
            self.reporter.log("##[error]The job reached the deadline set when it was claimed; it was stopped.")
        return self.aborted

    def halted(self) -> bool:
        """Between steps: whether nothing more may run (aborted, shutting down, past the deadline).
        Also notes a cancellation and the job timeout, which change the status later steps see."""
        self.note_cancel()
        if self.aborted or self.note_shutdown() or self.past_hard_deadline():
            return True
        if not self.deadlines.job_timed_out and self.now() >= self.deadlines.job:
            self.time_out_job()
        return False

    # -- one running step -----------------------------------------------------------------

    async def supervise(
        self,
        task: asyncio.Task[Any],
        stop: StopSignal,
        *,
        still_wanted: Callable[[], bool],
        step_deadline: float | None = None,
        caller: StopSignal | None = None,
    ) -> Stop | None:
        """Watch `task` until it ends; returns why it was stopped, or None. `caller` is the stop
        signal of the step that called this one's action (a composite action's step)."""
        reason: Stop | None = None
        reacted_to_cancel = self.cancel_seen
        while not task.done() and reason is None:
            waiters: set[asyncio.Future[object]] = {task, self._shutdown_wait}  # type: ignore[arg-type]
            if caller is not None:
                waiters.add(asyncio.ensure_future(caller.event.wait()))
            if not reacted_to_cancel:
                waiters.add(self._cancel_wait)  # type: ignore[arg-type]
            limits = [t for t in (step_deadline, self.deadlines.job, self.deadlines.hard) if t is not None]
            timeout = max(0.0, min(limits) - self.now()) if limits else None
            try:
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    if waiter is not task and waiter is not self._shutdown_wait and waiter is not self._cancel_wait:
                        waiter.cancel()
            if task.done():
                break
            now = self.now()
            if self.note_shutdown():
                reason = Stop.ABORTED
            elif caller is not None and caller.reason is not None:
                reason = caller.reason
            elif self.reporter.cancelled.is_set() and not reacted_to_cancel:
                reacted_to_cancel = True
                self.note_cancel()
                if self.aborted:
                    reason = Stop.ABORTED
                elif self.contexts.status == "cancelled" and not still_wanted():
                    reason = Stop.CANCELLED
            elif self.deadlines.hard is not None and now >= self.deadlines.hard:
                self.past_hard_deadline()
                reason = Stop.DEADLINE
            elif step_deadline is not None and now >= step_deadline:
                reason = Stop.STEP_TIMEOUT
            elif now >= self.deadlines.job:
                if not self.deadlines.job_timed_out:
                    self.time_out_job()
                reason = Stop.JOB_TIMEOUT
        if reason is not None:
            stop.set(reason)
            t = self.timings
            await asyncio.wait({task}, timeout=t.sigint_grace + t.sigterm_grace + t.drain_after_exit + 2)
            if not task.done():
                task.cancel()
                await asyncio.wait({task})  # our own cancellation still propagates
        return reason
