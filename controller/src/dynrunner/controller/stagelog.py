"""What the controller tells Gitea about a task before its executor takes over.

* `StageLog` appends short lines to the job log ("claimed by pool … as runner …"), so a user
  sees why a job is waiting. Best effort: a line that cannot be written is logged here and
  dropped; it never fails a launch.
* `Heartbeat` sends a non-final UpdateTask every few seconds, so Gitea's zombie reaper never
  fails a slow start, and notices when the task ended meanwhile (a user cancelled the run).

Both stop before the executor starts: the executor owns the log from then on (stage lines
and executor rows must never race for one index), and Gitea recomputes step states from
every UpdateTask, so a heartbeat without the executor's step states would make finished
steps look running again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from dynrunner.controller.finalize import rows
from dynrunner.proto.gitea import GiteaClient, GiteaError, Result, TaskState, Unauthenticated
from dynrunner.proto.gitea.client import RetryPolicy

log = logging.getLogger(__name__)

STAGE_RETRY = RetryPolicy(attempts=3, max_delay_s=10.0, initial_s=0.2, max_backoff_s=2.0)
HEARTBEAT_INTERVAL_S = 5.0


class StageLog:
    """Appends controller lines to one task's log, at the server's ack index.

    `next_index` is where the caller believes the log ends (0 for a task just claimed, 1
    for the launcher: the claimer wrote one line). A guess past the end costs one more call:
    Gitea writes nothing, answers its ack index, and we append there. A guess short of the
    end makes Gitea take our first rows for ones it has; the launcher's guess can only be
    short after an earlier attempt wrote the very same line.
    """

    def __init__(self, client: GiteaClient, task_id: int, *, next_index: int = 0) -> None:
        self._client = client
        self._task_id = task_id
        self._next = next_index

    @property
    def next_index(self) -> int:
        return self._next

    async def write(self, *lines: str) -> bool:
        """Append `lines`; False if Gitea could not take them (the launch goes on regardless)."""
        new_rows = rows(lines)
        try:
            for _ in range(3):
                ack = await self._client.update_log(self._task_id, self._next, new_rows, retry=STAGE_RETRY)
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
    """The task ended while the controller held it (cancelled, or reaped by Gitea)."""

    def __init__(self, task_id: int, result: Result | None) -> None:
        word = result.word if result is not None else "ended (its runner is gone)"
        super().__init__(f"task {task_id} was {word} before its executor started")
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
        self._stopping = asyncio.Event()
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
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)
            if self._stopping.is_set():
                return
            try:
                await self.beat()
            except TaskEnded as ended:
                self.ended = ended
                return
            except GiteaError as err:
                log.warning("task %s: heartbeat failed: %s", self._task_id, err)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=f"heartbeat-{self._task_id}")

    def cancel(self) -> None:
        """Stop at once (the launch itself was cancelled)."""
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
