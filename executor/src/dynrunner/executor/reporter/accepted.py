"""What Gitea last accepted of the task's state, kept in a file for the controller.

When the executor's environment ends before the executor finalized the task (killed, out of
memory, its wrapper gone), the controller finalizes it and sends a final state for every
step; Gitea would otherwise show the steps that started as running. Only the executor knows
which steps finished and where their log ranges are, so after each UpdateTask Gitea took it
writes what Gitea now holds: the task's result (set once it finalized) and every step it
reported, as a runner.v1 `TaskState` message. The file is replaced whole (a temporary file
renamed over it), so a reader sees one accepted report or the one before.

A backend that can read the file back names it in `DYNRUNNER_STATE_FILE` (the local backend
does; so does the VM's entrypoint: the opensandbox backend reads the file through execd, or,
once the executor died and the VM with it, from the console, where the entrypoint printed it).
A Pod's files go with it, so there the state is also written as the container's termination message
(`DYNRUNNER_TERMINATION_MESSAGE_PATH`), in the short form of `dynrunner.proto.accepted` that
fits the kubelet's 4096 bytes; it is written in place (the file is a bind mount), so a kill in
the middle of a write leaves a message that reads as no state. Without either nothing is
written. The job runs as the executor's user and could rewrite them: at worst that misstates
its own task's steps, which it can do through its own log and steps anyway.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from dynrunner.proto import accepted
from dynrunner.proto.gitea import Result, StepState, TaskState

log = logging.getLogger(__name__)

STATE_FILE_ENV = "DYNRUNNER_STATE_FILE"
TERMINATION_MESSAGE_ENV = "DYNRUNNER_TERMINATION_MESSAGE_PATH"


class AcceptedState:
    def __init__(self, path: str | None, termination_message: str | None = None) -> None:
        self._path = Path(path) if path else None
        self._message = Path(termination_message) if termination_message else None
        self._steps: dict[int, StepState] = {}
        self._result = Result.UNSPECIFIED

    def took(self, state: TaskState) -> None:
        """Gitea took `state` (its steps are the reporter's copies, kept as they are)."""
        if self._path is None and self._message is None:
            return
        for step in state.steps:
            self._steps[step.id] = step
        if state.result is not Result.UNSPECIFIED:
            self._result = state.result
        kept = TaskState(
            id=state.id,
            result=self._result,
            started_at=state.started_at,
            stopped_at=state.stopped_at,
            steps=[self._steps[index] for index in sorted(self._steps)],
        )
        if self._message is not None:
            self._write_message(kept)
        if self._path is None:
            return
        temporary = self._path.with_name(self._path.name + ".new")
        try:
            temporary.write_bytes(kept.encode())
            os.replace(temporary, self._path)
        except OSError as err:
            log.warning(
                "task %d: cannot keep its accepted state in %s (%s); not trying again", state.id, self._path, err
            )
            self._path = None

    def _write_message(self, kept: TaskState) -> None:
        assert self._message is not None
        try:
            self._message.write_text(accepted.dumps(accepted.encode(kept)))
        except OSError as err:
            log.warning(
                "task %d: cannot write its accepted state as the termination message %s (%s)",
                kept.id,
                self._message,
                err,
            )
            self._message = None


def add_to_termination_message(path: str, summary: dict[str, float]) -> None:
    """Add `summary` to the termination message at `path`, keeping the state already there
    (`encode` left room for it). Raises OSError."""
    message = Path(path)
    try:
        doc = json.loads(message.read_text() or "{}")
    except (FileNotFoundError, ValueError):
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    message.write_text(accepted.dumps({**doc, **summary}))
