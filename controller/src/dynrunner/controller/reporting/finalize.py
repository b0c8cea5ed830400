"""The one path that ends a task on the executor's behalf (claimer, launcher and reaper use it).

Order matters for ephemeral runners: the log goes first, with `no_more`, and only then the
final UpdateTask — the final UpdateTask deletes the runner, whose credentials every later
call needs. Each step tolerates the task having been ended already by someone else (the
executor, a user's cancel, Gitea's zombie reaper): an archived log, a task already final
and a runner already deleted all count as done.

The final UpdateTask carries a state for every step of the job (`final_steps`). Gitea's
`UpdateTaskByState` (the same from v1.24.0 to main, models/actions/task.go) rewrites each
step row: a step the request leaves out becomes `running` again if it ever started, so a
finalize without steps left a failed job showing its started steps as running and the rest
as waiting. Zero fields in a step (no start time, no log range) keep what Gitea stored
(xorm writes only non-zero fields), so a result alone changes only the step's status.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from dynrunner.proto.gitea import (
    AlreadyExists,
    GiteaClient,
    GiteaError,
    LogRow,
    Result,
    StepState,
    TaskState,
    Unauthenticated,
)

log = logging.getLogger(__name__)

LINE_PREFIX = "[dynrunner] "


class FinalizeOutcome(enum.Enum):
    FINALIZED = "finalized"
    """Our lines are in the log and the task ended with our result."""
    ALREADY_FINAL = "already-final"
    """The task had ended before (the log was archived or Gitea kept another result)."""
    RUNNER_GONE = "runner-gone"
    """The claiming runner no longer exists. Not proof that the task ended: Gitea deletes an
    ephemeral runner when its task ends, but an admin may have deleted it while the task
    ran, and then nobody can report for the task until Gitea's zombie reaper fails it."""
    REJECTED = "rejected"
    """Gitea refused for good (e.g. the task no longer exists); retrying cannot help."""


def rows(lines: Sequence[str], now: datetime | None = None) -> list[LogRow]:
    """Controller log rows: prefixed so a reader tells them from the job's own output."""
    stamp = now or datetime.now(UTC)
    return [LogRow(time=stamp, content=LINE_PREFIX + line) for line in lines]


def final_steps(count: int, reported: Sequence[StepState] | None, now: datetime) -> list[StepState]:
    """The state of each of the job's `count` steps for a task the controller ends.

    `reported`: the step states Gitea last accepted from the executor, when they can be had
    (None: unknown). A step that finished is sent as it was; one that started and did not
    finish is cancelled at `now`; one that never started is skipped. Without `reported`
    nobody can tell which steps ran: every step is cancelled (its start and log range, if
    Gitea has them, stay as they are)."""
    if reported is None:
        return [StepState(index, Result.CANCELLED) for index in range(count)]
    known = {step.id: step for step in reported if step.id >= 0}
    steps = []
    for index in range(max(count, max(known, default=-1) + 1)):
        step = known.get(index)
        if step is not None and step.result is not Result.UNSPECIFIED:
            steps.append(replace(step))
        elif step is not None and step.started_at is not None:
            steps.append(replace(step, result=Result.CANCELLED, stopped_at=step.stopped_at or now))
        else:
            steps.append(StepState(index, Result.SKIPPED))
    return steps


async def finalize_task(
    client: GiteaClient, task_id: int, result: Result, lines: Sequence[str], steps: Sequence[StepState] = ()
) -> FinalizeOutcome:
    """Append `lines`, close the log, then report `result` as the task's final state, with
    `steps` (`final_steps`).

    `client` carries the claiming runner's credentials. Raises GiteaError only for transient
    errors that outlasted the client's retries (the caller tries again later).
    """
    now = datetime.now(UTC)
    try:
        ours = await _close_log(client, task_id, rows(lines or ["the task was ended by the controller"], now))
        if ours is None:
            log.info("task %s: its log was already closed", task_id)
        else:
            steps = _within(steps, ours)
        state = await client.update_task(TaskState(id=task_id, result=result, stopped_at=now, steps=list(steps)))
    except Unauthenticated:
        return FinalizeOutcome.RUNNER_GONE
    except GiteaError as err:
        if err.transient:
            raise
        log.error("task %s: Gitea refused to end it: %s", task_id, err)
        return FinalizeOutcome.REJECTED
    if state.result is not result:
        log.info("task %s had already ended with result %s", task_id, state.result.word or "unknown")
        return FinalizeOutcome.ALREADY_FINAL
    return FinalizeOutcome.FINALIZED


async def finalize_failed(
    client: GiteaClient, task_id: int, reason: str, steps: Sequence[StepState] = ()
) -> FinalizeOutcome:
    """End the task as failed, with `steps` (`final_steps`), and tell the user why, in its job log."""
    first, *rest = reason.splitlines() or ["no reason was recorded"]
    outcome = await finalize_task(client, task_id, Result.FAILURE, [f"the job failed: {first}", *rest], steps)
    if outcome is FinalizeOutcome.FINALIZED:
        log.warning("task %s finalized as failed: %s", task_id, first)
    elif outcome is FinalizeOutcome.RUNNER_GONE:
        log.warning(
            "task %s not finalized: its runner no longer exists. Either the task had ended (Gitea deletes "
            "an ephemeral runner with its task), or an admin deleted the runner, and then the task stays "
            "running in Gitea until its zombie reaper fails it ([actions] ZOMBIE_TASK_TIMEOUT, 10 minutes "
            "by default). It was to fail: %s",
            task_id,
            first,
        )
    return outcome


async def _close_log(client: GiteaClient, task_id: int, new_rows: list[LogRow]) -> int | None:
    """Append `new_rows` at the server's ack index with `no_more`; the index they landed at,
    None if the log was already archived (or could not be closed: the final UpdateTask still
    ends the task)."""
    try:
        index = await client.update_log(task_id, 0, [])
        for _ in range(3):
            ack = await client.update_log(task_id, index, new_rows, no_more=True)
            if ack == index + len(new_rows):
                return index
            # The log moved under us (or the server is behind): append at its ack instead.
            index = ack
    except AlreadyExists:
        return None
    except Unauthenticated:
        raise
    except GiteaError as err:
        if err.transient:
            raise
        log.warning("task %s: could not write the final log lines: %s", task_id, err)
    return None


def _within(steps: Sequence[StepState], end: int) -> list[StepState]:
    """`steps` with their log ranges cut at `end`, where the controller's closing lines begin:
    an executor that died can have reported a range over rows Gitea never received, and that
    range would then show the controller's lines as the step's output."""
    cut = []
    for step in steps:
        start = min(step.log_index, end)
        cut.append(
            step if step.log_index + step.log_length <= end else replace(step, log_index=start, log_length=end - start)
        )
    return cut
