"""Which log rows belong to which step, the way Gitea's web UI reads them.

Gitea shows rows before the first step that ran as "Set up job" and starts "Complete job"
at ``first_run_step.log_index + sum(step.log_length)`` (`FullSteps`), so step ranges must
be contiguous: every row after the first step started is inside some step's range until
the last one ends. The rules that keep them so:

- a row logged while a step runs belongs to it, whatever step number it names;
- a row naming the most recently started step still belongs to it after it finished;
- any other row between steps is held back and becomes the start of the next step that
  starts; when none does, it stays after the last range, i.e. in "Complete job".

What an UpdateTask must carry (`report`) follows Gitea's `UpdateTaskByState` (the same at
v1.24.0, v1.25.0, v1.26.0 and on main): it rewrites every step row of the task, taking the
fields of the step whose `id` is the row's index when the request has one; a step the
request leaves out keeps its stored fields, and its status becomes `running` if it has a
start time, else stays. So every step that started must be in every report (left out, a
finished step would show as running again), while a step never touched can be left out
(it stays waiting), and so can one that finished without starting (skipped) once Gitea has
it. Times are whole seconds: Gitea stores no more, and the fractions were a third of each
step's bytes on the wire.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from dynrunner.proto.gitea import Result, StepState


class StepTracker:
    def __init__(self, count: int = 0) -> None:
        self.steps = [StepState(id=i) for i in range(count)]
        self._last: int | None = None  # most recently started step
        self._running: int | None = None
        self._covered = 0  # end of the rows inside step ranges (valid once a step started)
        self._started: list[StepState] = []  # in start order
        self._unstarted: dict[int, int] = {}  # finished without starting, Gitea not known to have them: change count
        self._changes = 0

    @property
    def running(self) -> int | None:
        return self._running

    def _check(self, index: int) -> StepState:
        if not 0 <= index < len(self.steps):
            raise IndexError(f"step {index} does not exist (the job has {len(self.steps)} steps)")
        return self.steps[index]

    def start(self, index: int, now: datetime, next_row: int) -> None:
        step = self._check(index)
        if step.started_at is not None:
            return
        step.started_at = _seconds(now)
        self._started.append(step)
        self._unstarted.pop(index, None)
        step.log_index = next_row if self._last is None else self._covered
        step.log_length = next_row - step.log_index
        self._covered = next_row
        self._last = self._running = index

    def finish(self, index: int, result: Result, now: datetime, next_row: int) -> None:
        step = self._check(index)
        step.result = result
        step.stopped_at = _seconds(now)
        if step.started_at is None:
            self._unsent(index)
            if step.log_length == 0:
                step.log_index = next_row
        if self._running == index:
            self._running = None

    def on_row(self, row: int, step: int | None) -> None:
        """Account for absolute row `row`, logged with the step number `step` (or none)."""
        if self._last is None:
            return
        owner = self._running
        if owner is None and step is not None and step == self._last:
            owner = step
        if owner is None:
            return
        state = self.steps[owner]
        state.log_length = row + 1 - state.log_index
        self._covered = row + 1

    def shift(self, position: int, delta: int) -> None:
        """Rows from `position` on moved up by `delta` (foreign rows inserted there)."""
        if delta <= 0:
            return
        for step in self.steps:
            if step.log_index >= position:
                step.log_index += delta
            elif step.log_index + step.log_length > position:
                step.log_length += delta
            else:
                continue
            if step.started_at is None and step.result != Result.UNSPECIFIED:
                self._unsent(step.id)
        if self._last is not None and self._covered >= position:
            self._covered += delta

    def close(self, now: datetime, *, skipped: bool) -> None:
        """Unfinished steps end as CANCELLED, or SKIPPED when the whole job was skipped."""
        for step in self.steps:
            if step.result == Result.UNSPECIFIED:
                step.result = Result.SKIPPED if skipped else Result.CANCELLED
                if step.started_at is not None and step.stopped_at is None:
                    step.stopped_at = _seconds(now)
                elif step.started_at is None:
                    self._unsent(step.id)
        self._running = None

    def snapshot(self) -> list[StepState]:
        """Every step's state, copied."""
        return [replace(step) for step in self.steps]

    def report(self) -> tuple[list[StepState], dict[int, int]]:
        """What the next UpdateTask must carry (see the module docstring), copied, with the
        receipt to `confirm` once Gitea has taken it."""
        steps = self._started + [self.steps[i] for i in self._unstarted]
        copies = [
            StepState(s.id, s.result, s.started_at, s.stopped_at, s.log_index, s.log_length)
            for s in sorted(steps, key=_by_id)
        ]
        return copies, dict(self._unstarted)

    def confirm(self, receipt: dict[int, int]) -> None:
        """Gitea took a report: the steps in it that finished without starting and have not
        changed since need not be sent again."""
        for index, change in receipt.items():
            if self._unstarted.get(index) == change:
                del self._unstarted[index]

    def _unsent(self, index: int) -> None:
        self._changes += 1
        self._unstarted[index] = self._changes


def _by_id(step: StepState) -> int:
    return step.id


def _seconds(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)
