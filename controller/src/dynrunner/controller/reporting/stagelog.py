"""What the controller tells Gitea about a task before its executor takes over.

* `StageLog` appends short lines to the job log ("claimed by pool … as runner …"), so a user
  sees why a job is waiting. Best effort: a line that cannot be written (retried within a
  `RetryPolicy`) is logged here and dropped; it never fails a launch.
* `ClaimedLines` holds the claimer's line of each claim for a moment, so the launcher's first
  line takes it along: a fast launch costs Gitea one UpdateLog, not two. A line nobody took
  within `CLAIMED_LINE_DELAY_S` is written on its own (a slow launch still shows the claim);
  if Gitea does not take it then, it is kept for the launcher's line and tried again now and
  then, for at most `CLAIMED_LINE_KEEP_S`.
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
from dataclasses import dataclass, field

from dynrunner.controller.infra.loops import Stopping
from dynrunner.controller.reporting.finalize import rows
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
CLAIMED_LINE_KEEP_S = 15 * 60.0
"""A held-back line Gitea did not take is tried again every `CLAIMED_LINE_RETRY_S` and given up
(logged) this long after its claim. A launcher takes it within seconds, so one still held then
belongs to an assignment never launched here (refused, or its start failed before any line):
kept, it would stay for the life of the controller."""


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

    @property
    def next_index(self) -> int | None:
        return self._next

    async def write(self, *lines: str, before: Sequence[LogRow] = (), retry: RetryPolicy = STAGE_RETRY) -> bool:
        """Append `before` (rows made earlier, with their own times) and `lines`; False if Gitea
        could not take them within `retry` (the launch goes on regardless)."""
        new_rows = [*before, *rows(lines)]
        try:
            if self._next is None:
                self._next = await self._client.update_log(self._task_id, 0, [], retry=retry)
            for _ in range(3):
                ack = await self._client.update_log(self._task_id, self._next, new_rows, retry=retry)
                if ack == self._next + len(new_rows):
                    self._next = ack
                    return True
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


@dataclass(eq=False)
class _Pending:
    client: GiteaClient
    task_id: int
    rows: list[LogRow]
    claimed_at: float = 0.0
    """The loop's time of the claim."""
    timer: asyncio.TimerHandle | None = None
    writing: asyncio.Task[None] | None = field(default=None, repr=False)


class ClaimedLines:
    """The first stage line of each claim not launched yet, by assignment id.

    The claimer `defer`s its line (stamped with the claim time); the launcher `take`s it and
    writes it together with its own first line at index 0. A line still here `delay_s` after
    the claim is written alone, and `take` then waits for that write, so the two writers never
    race for one index; a line that write could not get into Gitea (down) stays here for the
    launcher to take along. `flush` writes whatever is left (at shutdown).
    """

    def __init__(self, delay_s: float = CLAIMED_LINE_DELAY_S) -> None:
        self._delay_s = delay_s
        self._pending: dict[str, _Pending] = {}
        self._writes: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._pending)

    def defer(self, key: str, client: GiteaClient, task_id: int, line: str) -> None:
        loop = asyncio.get_running_loop()
        pending = _Pending(client, task_id, rows([line]), claimed_at=loop.time())
        pending.timer = loop.call_later(self._delay_s, self._write_now, key)
        self._pending[key] = pending

    async def take(self, key: str) -> list[LogRow]:
        """The rows to write first, at index 0; [] when they are written already (or none is known)."""
        pending = await self._take(key)
        return pending.rows if pending is not None else []

    async def write(self, key: str) -> None:
        """Write the line of `key` now if it is still pending (before its task is finalized)."""
        pending = await self._take(key)
        if pending is not None:
            await StageLog(pending.client, pending.task_id, next_index=0).write(before=pending.rows)

    async def _take(self, key: str) -> _Pending | None:
        pending = self._pending.get(key)
        if pending is None:
            return None
        if pending.writing is not None:
            await asyncio.wait([pending.writing])  # shielded from our caller's cancellation, never raises
            if self._pending.get(key) is not pending:
                return None  # written
        del self._pending[key]
        if pending.timer is not None:
            pending.timer.cancel()
        return pending

    async def flush(self) -> None:
        for key in list(self._pending):
            self._write_now(key)
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def _write_now(self, key: str) -> None:
        pending = self._pending.get(key)
        if pending is None or pending.writing is not None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        writing = asyncio.create_task(self._write(key, pending), name=f"stage-line-{pending.task_id}")
        pending.writing = writing
        self._writes.add(writing)
        writing.add_done_callback(self._writes.discard)

    async def _write(self, key: str, pending: _Pending) -> None:
        written = False
        try:
            written = await StageLog(pending.client, pending.task_id, next_index=0).write(before=pending.rows)
        finally:
            if written:
                self._pending.pop(key, None)
            elif self._pending.get(key) is pending:
                pending.writing = None  # kept: the launcher's write takes it along, or a retry
                loop = asyncio.get_running_loop()
                if loop.time() - pending.claimed_at < CLAIMED_LINE_KEEP_S:
                    pending.timer = loop.call_later(CLAIMED_LINE_RETRY_S, self._write_now, key)
                else:
                    del self._pending[key]
                    log.warning("task %s: the claim's stage line was given up (Gitea did not take it)", pending.task_id)
