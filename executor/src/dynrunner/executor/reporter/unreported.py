"""A task Gitea has ended under the executor, and where the job's output goes from then on.

Gitea 1.24–1.26 have no `cancelling` state: a cancel stops the task at once and deletes its
ephemeral runner, so the executor's next call is refused ("unregistered runner"); its zombie
and endless-task reapers do the same, and an admin may delete the runner. The job is over
for Gitea, but its `if: always()`/`cancelled()` steps and its actions' post stages still
have cleanup to do. They run; what they print cannot reach the job log any more, so it goes
to the executor's own stderr (a Pod's or a sandbox's log), masked as every job row is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from dynrunner.executor.reporter.rows import cap, split_rows, valid_utf8
from dynrunner.proto.gitea import AlreadyExists, Internal, Unauthenticated
from dynrunner.proto.masking import Masker

_TASK_GONE = "resource does not exist"  # Gitea's text for a task that no longer exists


def ends_task(err: BaseException) -> bool:
    """Whether Gitea's refusal shows the task is over: its runner is gone (Gitea deletes an
    ephemeral runner with its task), someone else archived its log (a reaper), or the task
    itself is gone. Passing failures (a front end's 5xx page, a Gitea restart, timeouts)
    never do: they are transient and retried."""
    if isinstance(err, Unauthenticated | AlreadyExists):
        return True
    return isinstance(err, Internal) and not err.transient and _TASK_GONE in err.message


def why_ended(err: BaseException) -> str:
    if isinstance(err, Unauthenticated):
        return (
            f"its runner is gone ({err}). Gitea 1.24-1.26 delete the runner when a run is cancelled "
            "(also when the zombie or endless-task reaper stops the task, or an admin deletes the runner)"
        )
    if isinstance(err, AlreadyExists):
        return f"its log was closed by Gitea ({err}): the task was stopped (a reaper, or a cancel)"
    return f"the task no longer exists ({err})"


def to_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


class UnreportedOutput:
    """The job's rows after Gitea ended its task: masked, capped and marked with the task, so
    they read apart from the executor's own log lines."""

    def __init__(self, task_id: int, masker: Masker, write: Callable[[str], None]) -> None:
        self._prefix = f"[task {task_id}, not reported] "
        self._masker = masker
        self._write = write

    def rows(self, contents: list[str]) -> None:
        """Rows that were masked and capped already (they were on their way to Gitea)."""
        if contents:
            self._write("".join(f"{self._prefix}{content}\n" for content in contents))

    def log(self, text: str | bytes) -> None:
        self.rows([cap(self._masker.mask(line)) for line in split_rows(valid_utf8(text))])

    def say(self, text: str) -> None:
        """A line of the executor's own about the job, not one of the job's rows."""
        self._write(f"dynrunner-executor: {self._masker.mask(text)}\n")
