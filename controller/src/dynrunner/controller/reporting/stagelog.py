"""What the controller tells Gitea about a task before its executor takes over.

* `StageLog` appends short lines to the job log ("claimed by pool … as runner …"), so a user
  sees why a job is waiting. Best effort: a line that cannot be written (retried within a
  `RetryPolicy`) is logged here and dropped; it never fails a launch.
* `ClaimLine` is the claim's line ("claimed by pool … as runner …"), made from the assignment
  by the launcher that launches it, whichever replica claimed: its first line takes it along
  (a fast launch costs Gitea one UpdateLog, not two), and one not taken within
  `CLAIMED_LINE_DELAY_S` of the claim is written on its own (a slow launch still shows it).
* `Heartbeat` sends a non-final UpdateTask every few seconds, so Gitea's zombie reaper never
  fails a slow start, and notices when the task ended meanwhile (a user cancelled the run).

Both stop before the executor starts: the executor owns the log from then on (stage lines
and executor rows must never race for one index), and Gitea recomputes step states from
every UpdateTask, so a heartbeat without the executor's step states would make finished
steps look running again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from dynrunner.controller.infra.loops import Stopping
from dynrunner.controller.reporting.finalize import rows
from dynrunner.proto.assignment import Assignment
from dynrunner.proto.gitea import GiteaClient, GiteaError, LogRow, Result, TaskState, Unauthenticated
from dynrunner.proto.gitea.client import RetryPolicy

log = logging.getLogger(__name__)

STAGE_RETRY = RetryPolicy(attempts=3, max_delay_s=10.0, initial_s=0.2, max_backoff_s=2.0)
LAST_STAGE_RETRY = RetryPolicy(attempts=100, max_delay_s=60.0, initial_s=0.2, max_backoff_s=2.0)
"""For the lines written right before the executor starts: the executor can do nothing until
Gitea answers either, so waiting out a short Gitea outage here costs nothing and keeps them."""
HEARTBEAT_INTERVAL_S = 5.0
CLAIMED_LINE_DELAY_S = 1.0
CLAIMED_LINE_RETRY_S = 30.0
"""A claim line Gitea did not take alone is tried again this often, while its launch holds it."""


class StageLog:
    """Appends controller lines to one task's log, at the server's ack index.

    `next_index` is where the caller believes the log ends (0 for a task just claimed, 1
    for the launcher: the claimer wrote one line; None when it cannot know, e.g. following a
    start again after a restart: Gitea is asked first, with an empty UpdateLog). A guess
    past the end costs one more call: Gitea writes nothing, answers its ack index, and we
    append there. A guess short of the end makes Gitea take our first rows for ones it has;
    the launcher's guess can only be short after an earlier attempt wrote the very same line.
    """

    def __init__(self, client: GiteaClient, task_id: int, *, next_index: int | None = 0) -> None:
        self._client = client
        self._task_id = task_id
        self._next = next_index
        self._yielded = False

    @property
    def next_index(self) -> int | None:
        return self._next

    async def write(self, *lines: str, before: Sequence[LogRow] = (), retry: RetryPolicy = STAGE_RETRY) -> bool:
        """Append `before` (rows made earlier, with their own times) and `lines`; False if Gitea
        could not take them within `retry` (the launch goes on regardless)."""
        if self._yielded:
            return False
        new_rows = [*before, *rows(lines)]
        try:
            if self._next is None:
                self._next = await self._client.update_log(self._task_id, 0, [], retry=retry)
            for _ in range(3):
                ack = await self._client.update_log(self._task_id, self._next, new_rows, retry=retry)
                if ack == self._next + len(new_rows):
                    self._next = ack
                    return True
                if ack > self._next + len(new_rows):
                    # Rows we did not write lie past ours: the executor writes the log now, and a
                    # line appended at its end would take the index of its next row.
                    self._next, self._yielded = ack, True
                    log.info("task %s: stage line not written: the executor writes the log", self._task_id)
                    return False
                self._next = ack
        except GiteaError as err:
            log.warning("task %s: stage line not written: %s", self._task_id, err)
            return False
        log.warning("task %s: stage line not written: the log kept moving", self._task_id)
        return False


class TaskEnded(Exception):
    """The task ended while the controller held it (cancelled, or reaped by Gitea), or its
    runner is gone (`result` None): Gitea deleted it with the task, or an admin deleted it,
    and then no one can report for the task, which Gitea's zombie reaper fails later."""

    def __init__(self, task_id: int, result: Result | None) -> None:
        if result is not None:
            text = f"task {task_id} was {result.word} before its executor started"
        else:
            text = f"task {task_id} lost its runner before its executor started (the task ended, or it was deleted)"
        super().__init__(text)
        self.result = result


class Heartbeat:
    """Non-final UpdateTask calls on the claiming runner's behalf, until `stop()`.

    `beat()` sends one at once and raises TaskEnded when Gitea says the task is over;
    `run()` keeps beating every `interval_s` and records that in `ended`.
    """

    def __init__(self, client: GiteaClient, task_id: int, *, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self._client = client
        self._task_id = task_id
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = Stopping()
        self.ended: TaskEnded | None = None

    async def beat(self) -> None:
        try:
            state = await self._client.update_task(TaskState(id=self._task_id), retry=STAGE_RETRY)
        except Unauthenticated as err:
            # Gitea deletes an ephemeral runner when its task ends (including a user's cancel).
            raise TaskEnded(self._task_id, None) from err
        if state.result is not Result.UNSPECIFIED:
            raise TaskEnded(self._task_id, state.result)

    async def run(self) -> None:
        while not await self._stopping.sleep(self._interval_s):
            try:
                await self.beat()
            except TaskEnded as ended:
                self.ended = ended
                return
            except GiteaError as err:
                log.warning("task %s: heartbeat failed: %s", self._task_id, err)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=f"heartbeat-{self._task_id}")

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The beating loop while it runs (done once it learned the task ended)."""
        return self._task

    def cancel(self) -> None:
        """Stop at once (the launch itself was cancelled); a beat whose cancellation was lost
        is the last."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self) -> None:
        """Stop beating; returns once no UpdateTask of ours is in flight (a beat under way is
        let finish rather than cancelled: a cancelled request may still reach Gitea)."""
        if self._task is None:
            return
        self._stopping.set()
        try:
            await self._task
        finally:
            self._task = None


def claimed_line(pool: str, runner_name: str, runner_id: int, labels: Sequence[str]) -> str:
    return f"claimed by pool {pool} as runner {runner_name} (id {runner_id}, labels {', '.join(labels)})"


class ClaimLine:
    """The claim's stage line of one fresh launch, written by the replica that launches it.

    The line is made from the assignment (its pool, runner and claim time), so it travels with
    the assignment: whichever replica's launcher takes the job writes it, and the claimer,
    once it published, writes nothing (two replicas writing one log raced for its index 0,
    and the claimer's line landed inside the executor's log). The launch's first line takes
    it along (`take`: one UpdateLog for both). If no line comes within `delay_s` of the claim
    (a slow create, a Pod not scheduled yet) it is written alone, and again every
    `CLAIMED_LINE_RETRY_S` while Gitea does not take it, until the launch takes it or lets
    go (`aclose`): never after the executor may have started.

    Written alone, it goes to index 0 only, never to Gitea's ack: a log that holds rows
    already holds this very line (an earlier attempt of the launch wrote it), and appending
    it at the end would put it among other rows.
    """

    def __init__(
        self,
        client: GiteaClient,
        task_id: int,
        line: str,
        claimed_at: datetime,
        *,
        delay_s: float = CLAIMED_LINE_DELAY_S,
    ) -> None:
        self._client = client
        self._task_id = task_id
        self._rows = rows([line], claimed_at)
        self._held = True
        self._closed = False
        self._writing: asyncio.Task[bool] | None = None
        age = (datetime.now(UTC) - claimed_at).total_seconds()
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            max(0.0, delay_s - age), self._write_now
        )

    @classmethod
    def of(cls, assignment: Assignment, client: GiteaClient, *, delay_s: float = CLAIMED_LINE_DELAY_S) -> ClaimLine:
        runner = assignment.runner
        line = claimed_line(assignment.pool, runner.name, runner.id, runner.labels)
        return cls(client, assignment.task.id, line, assignment.claimed_at, delay_s=delay_s)

    @property
    def held(self) -> bool:
        """Not written (nor taken) yet."""
        return self._held

    async def take(self) -> list[LogRow]:
        """The rows to write first, at index 0, with the caller's own; [] once written (a
        write under way is waited for, so the two never race for one index)."""
        await self._settled()
        self._cancel_timer()
        if not self._held:
            return []
        self._held = False
        return self._rows

    async def write(self) -> None:
        """Write it now if it is still held (before the launch finalizes the task)."""
        if await self.take():
            await self._write_at_start()

    async def aclose(self) -> None:
        """The launch lets go of the log (the executor may start, or another replica resumes):
        nothing more is written, and a write under way has ended on return."""
        self._closed = True
        self._cancel_timer()
        await self._settled()

    def discard(self) -> None:
        """Write nothing more (the launch was cancelled); a write under way still ends."""
        self._closed = True
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _settled(self) -> None:
        if self._writing is not None:
            await asyncio.wait([self._writing])  # shielded from our caller's cancellation, never raises

    def _write_now(self) -> None:
        self._timer = None
        if self._closed or not self._held or self._writing is not None:
            return
        self._writing = asyncio.create_task(self._write_alone(), name=f"stage-line-{self._task_id}")

    async def _write_alone(self) -> bool:
        written = await self._write_at_start()
        self._writing = None
        if written:
            self._held = False
        elif not self._closed:
            self._timer = asyncio.get_running_loop().call_later(CLAIMED_LINE_RETRY_S, self._write_now)
        return written

    async def _write_at_start(self) -> bool:
        try:
            ack = await self._client.update_log(self._task_id, 0, self._rows, retry=STAGE_RETRY)
        except GiteaError as err:
            log.warning("task %s: the claim's stage line not written yet: %s", self._task_id, err)
            return False
        return ack >= len(self._rows)
