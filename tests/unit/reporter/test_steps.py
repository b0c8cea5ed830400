"""Step ranges: log_index/log_length arithmetic as Gitea's web UI reads it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynrunner.executor.reporter.steps import StepTracker
from dynrunner.proto.gitea import Result, StepState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ui_ranges(steps: list[StepState], total_rows: int) -> dict[str, range]:
    """Which rows Gitea's UI shows under which heading (`modules/actions/task_state.go`
    FullSteps for a finished task): "Set up job" ends where the first step that ran
    starts; "Complete job" starts after the sum of all step lengths."""
    ran = [s for s in steps if s.result in (Result.SUCCESS, Result.FAILURE)]
    pre_len = ran[0].log_index if ran else total_rows
    out = {"Set up job": range(pre_len)}
    for s in steps:
        out[f"step {s.id}"] = range(s.log_index, s.log_index + s.log_length)
    post_start = pre_len + sum(s.log_length for s in steps)
    out["Complete job"] = range(post_start, total_rows)
    return out


class Log:
    """Drives a tracker the way the reporter does: rows get consecutive indexes."""

    def __init__(self, steps: int, first_row: int = 0) -> None:
        self.tracker = StepTracker(steps)
        self.next = first_row
        self.owner: dict[int, str] = {}

    def row(self, label: str, step: int | None = None) -> None:
        self.owner[self.next] = label
        self.tracker.on_row(self.next, step)
        self.next += 1

    def start(self, i: int) -> None:
        self.tracker.start(i, T0, self.next)

    def finish(self, i: int, result: Result = Result.SUCCESS) -> None:
        self.tracker.finish(i, result, T0, self.next)

    next_step = 0  # the next step an engine running them in order starts or skips

    def engine(self, op: str) -> None:
        """`start` the next step, `finish` the running one or `skip` the next, when the engine can."""
        running = self.tracker.running
        if op == "finish" and running is not None:
            self.finish(running, Result.SUCCESS)
        elif op in ("start", "skip") and running is None and self.next_step < len(self.tracker.steps):
            if op == "start":
                self.start(self.next_step)
            else:
                self.finish(self.next_step, Result.SKIPPED)
            self.next_step += 1

    def shown(self) -> dict[str, list[str]]:
        ranges = ui_ranges(self.tracker.snapshot(), self.next)
        return {name: [self.owner.get(i, f"foreign {i}") for i in rows] for name, rows in ranges.items()}


def test_rows_before_the_first_step_are_set_up_job_and_after_the_last_complete_job() -> None:
    log = Log(2)
    log.row("setup")
    log.start(0)
    log.row("s0a", 0)
    log.row("s0b", 0)
    log.finish(0)
    log.start(1)
    log.row("s1", 1)
    log.finish(1)
    log.row("cleanup")
    assert log.shown() == {
        "Set up job": ["setup"],
        "step 0": ["s0a", "s0b"],
        "step 1": ["s1"],
        "Complete job": ["cleanup"],
    }
    s0, s1 = log.tracker.snapshot()
    assert (s0.log_index, s0.log_length, s1.log_index, s1.log_length) == (1, 2, 3, 1)


def test_ranges_continue_after_pre_existing_stage_lines() -> None:
    log = Log(1, first_row=5)
    log.start(0)
    log.row("s0", 0)
    log.finish(0)
    assert log.tracker.snapshot()[0].log_index == 5
    assert log.shown()["Set up job"] == [f"foreign {i}" for i in range(5)]


def test_rows_between_steps_open_the_next_step() -> None:
    log = Log(2)
    log.start(0)
    log.row("s0", 0)
    log.finish(0)
    log.row("between")
    log.start(1)
    log.row("s1", 1)
    log.finish(1)
    shown = log.shown()
    assert shown["step 1"] == ["between", "s1"]
    assert shown["Complete job"] == []


def test_a_row_for_the_finished_last_step_still_belongs_to_it() -> None:
    log = Log(2)
    log.start(0)
    log.row("s0", 0)
    log.finish(0)
    log.row("late s0", 0)
    log.start(1)
    log.finish(1)
    assert log.shown()["step 0"] == ["s0", "late s0"]


def test_rows_naming_another_step_go_to_the_running_one() -> None:
    log = Log(3)
    log.start(0)
    log.finish(0)
    log.start(1)
    log.row("says 0", 0)
    log.row("says 2", 2)
    log.row("says none")
    log.finish(1)
    shown = log.shown()
    assert shown["step 1"] == ["says 0", "says 2", "says none"]
    assert shown["step 2"] == []


def test_failure_then_skipped_steps_leave_the_rest_to_complete_job() -> None:
    log = Log(4)
    log.row("setup")
    log.start(0)
    log.row("ok", 0)
    log.finish(0)
    log.start(1)
    log.row("boom", 1)
    log.finish(1, Result.FAILURE)
    log.finish(2, Result.SKIPPED)
    log.row("job-level after failure")
    log.finish(3, Result.SKIPPED)
    log.row("Job failed")
    shown = log.shown()
    assert shown["Set up job"] == ["setup"]
    assert shown["step 1"] == ["boom"]
    assert shown["step 2"] == shown["step 3"] == []
    assert shown["Complete job"] == ["job-level after failure", "Job failed"]
    skipped = log.tracker.snapshot()[2]
    assert skipped.started_at is None and skipped.result == Result.SKIPPED


def test_a_step_without_rows_has_an_empty_range_at_its_place() -> None:
    log = Log(2)
    log.row("setup")
    log.start(0)
    log.finish(0)
    log.start(1)
    log.row("s1", 1)
    log.finish(1)
    s0, s1 = log.tracker.snapshot()
    assert (s0.log_index, s0.log_length, s1.log_index) == (1, 0, 1)


def test_close_cancels_or_skips_unfinished_steps() -> None:
    tracker = StepTracker(3)
    tracker.start(0, T0, 0)
    tracker.finish(0, Result.SUCCESS, T0, 0)
    tracker.start(1, T0, 0)
    later = datetime(2026, 1, 2, tzinfo=UTC)
    tracker.close(later, skipped=False)
    s0, s1, s2 = tracker.snapshot()
    assert (s0.result, s1.result, s2.result) == (Result.SUCCESS, Result.CANCELLED, Result.CANCELLED)
    assert s1.stopped_at == later and s2.stopped_at is None and s2.started_at is None

    tracker = StepTracker(2)
    tracker.close(later, skipped=True)
    assert [s.result for s in tracker.snapshot()] == [Result.SKIPPED, Result.SKIPPED]


def test_shift_moves_ranges_after_inserted_foreign_rows() -> None:
    log = Log(3)
    log.row("setup")
    log.start(0)
    log.row("s0a", 0)
    log.finish(0)
    log.start(1)
    log.row("s1a", 1)
    # Three foreign rows appear in Gitea at index 3, before our unacknowledged "s1b".
    log.tracker.shift(3, 3)
    log.owner = {0: "setup", 1: "s0a", 2: "s1a", 6: "s1b"}
    log.next = 6
    log.row("s1b", 1)
    log.finish(1)
    log.start(2)
    log.row("s2", 2)
    log.finish(2)
    shown = log.shown()
    assert shown["step 0"] == ["s0a"]
    assert shown["step 1"] == ["s1a", "foreign 3", "foreign 4", "foreign 5", "s1b"]
    assert shown["step 2"] == ["s2"]


def test_unknown_step_numbers_are_rejected() -> None:
    tracker = StepTracker(1)
    with pytest.raises(IndexError, match="step 1 does not exist"):
        tracker.start(1, T0, 0)
    with pytest.raises(IndexError):
        tracker.finish(-1, Result.SUCCESS, T0, 0)


def test_starting_a_step_twice_keeps_the_first_start() -> None:
    tracker = StepTracker(1)
    tracker.start(0, T0, 4)
    tracker.start(0, datetime(2027, 1, 1, tzinfo=UTC), 9)
    step = tracker.snapshot()[0]
    assert (step.started_at, step.log_index) == (T0, 4)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["row", "row-step", "row-last", "start", "finish", "skip"]), max_size=60))
def test_any_sequence_partitions_the_log_as_gitea_reads_it(ops: list[str]) -> None:
    """Whatever the engine does, "Set up job", the step ranges in order and "Complete job"
    cover every row exactly once (Gitea derives the last from the sum of step lengths)."""
    n_steps = 4
    log = Log(n_steps)
    for op in ops:
        running = log.tracker.running
        if op == "row":
            log.row("r")
        elif op == "row-step":
            log.row("r", running if running is not None else min(log.next_step, n_steps - 1))
        elif op == "row-last":
            log.row("r", max(log.next_step - 1, 0))
        else:
            log.engine(op)
    if log.tracker.running is not None:
        log.finish(log.tracker.running, Result.FAILURE)
    steps = log.tracker.snapshot()
    ran = [s for s in steps if s.started_at is not None]
    pre_end = ran[0].log_index if ran else log.next
    covered = pre_end
    for s in ran:
        assert s.log_index == covered  # contiguous, in order
        covered += s.log_length
    assert covered <= log.next
    shown = ui_ranges(steps, log.next)
    assert shown["Complete job"].start == covered
    every = [*shown["Set up job"], *(i for s in ran for i in shown[f"step {s.id}"]), *shown["Complete job"]]
    assert every == list(range(log.next))


# -- what an UpdateTask carries ------------------------------------------------------------


class GiteaSteps:
    """The task's step rows as Gitea's `UpdateTaskByState` keeps them (v1.24.0 … main): for
    each stored step, the request's step with `id == index` overwrites the fields (xorm's
    `Update` skips zero values); then the status is the result if one was sent, else
    `running` if the step has a start time, else unchanged."""

    def __init__(self, count: int) -> None:
        self.rows = [{"status": "waiting", "index": 0, "length": 0, "started": 0, "stopped": 0} for _ in range(count)]

    def update(self, steps: list[StepState]) -> None:
        given = {s.id: s for s in steps}
        for idx, row in enumerate(self.rows):
            result = Result.UNSPECIFIED
            if idx in given:
                s = given[idx]
                result = s.result
                fields = {
                    "index": s.log_index,
                    "length": s.log_length,
                    "started": int(s.started_at.timestamp()) if s.started_at else 0,
                    "stopped": int(s.stopped_at.timestamp()) if s.stopped_at else 0,
                }
                row.update({k: v for k, v in fields.items() if v})
            if result != Result.UNSPECIFIED:
                row["status"] = result.word
            elif row["started"]:
                row["status"] = "running"


def as_gitea_shows(step: StepState) -> dict[str, object]:
    status = step.result.word or ("running" if step.started_at else "waiting")
    return {
        "status": status,
        "index": step.log_index,
        "length": step.log_length,
        "started": int(step.started_at.timestamp()) if step.started_at else 0,
        "stopped": int(step.stopped_at.timestamp()) if step.stopped_at else 0,
    }


def test_a_report_carries_the_steps_that_started_and_leaves_untouched_ones_out() -> None:
    tracker = StepTracker(4)
    assert tracker.report()[0] == []
    tracker.start(0, T0, 0)
    assert [s.id for s in tracker.report()[0]] == [0]
    tracker.finish(0, Result.SUCCESS, T0, 3)
    tracker.start(1, T0, 3)
    assert [s.id for s in tracker.report()[0]] == [0, 1]  # a finished step goes with every report


def test_a_step_that_finished_without_starting_goes_until_gitea_has_it() -> None:
    tracker = StepTracker(3)
    tracker.start(0, T0, 0)
    tracker.finish(0, Result.FAILURE, T0, 2)
    tracker.finish(1, Result.SKIPPED, T0, 2)
    steps, receipt = tracker.report()
    assert [(s.id, s.result) for s in steps] == [(0, Result.FAILURE), (1, Result.SKIPPED)]
    tracker.confirm(receipt)
    assert [s.id for s in tracker.report()[0]] == [0]
    tracker.shift(2, 5)  # foreign rows before its empty range: its log_index moved
    steps, receipt = tracker.report()
    assert [(s.id, s.log_index) for s in steps] == [(0, 0), (1, 7)]
    tracker.close(T0, skipped=False)  # step 2 ends cancelled before this report was confirmed
    tracker.confirm(receipt)
    assert [s.id for s in tracker.report()[0]] == [0, 2]


def test_a_change_after_the_report_was_taken_is_sent_again() -> None:
    tracker = StepTracker(2)
    tracker.finish(0, Result.SKIPPED, T0, 0)
    _, receipt = tracker.report()
    tracker.shift(0, 3)
    tracker.confirm(receipt)  # Gitea has the old log_index only
    assert [(s.id, s.log_index) for s in tracker.report()[0]] == [(0, 3)]


def test_step_times_are_whole_seconds_as_gitea_stores_them() -> None:
    tracker = StepTracker(1)
    tracker.start(0, T0.replace(microsecond=999_999), 0)
    tracker.finish(0, Result.SUCCESS, T0.replace(second=1, microsecond=1), 0)
    (step,) = tracker.report()[0]
    assert (step.started_at, step.stopped_at) == (T0, T0.replace(second=1))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["row", "start", "finish", "skip", "shift", "report", "lost-report", "taken-report"]),
        max_size=60,
    ),
    st.booleans(),
)
def test_gitea_shows_every_step_as_it_is_after_each_report(ops: list[str], skipped: bool) -> None:
    """Reports leave out what Gitea keeps on its own; after each one Gitea's step rows are
    exactly the tracker's steps (untouched ones waiting), whatever happened in between:
    reports lost on the way, or whose answer came after the steps changed again."""
    n_steps = 5
    log = Log(n_steps)
    gitea = GiteaSteps(n_steps)
    pending: dict[int, int] | None = None  # the receipt of a report Gitea took, its answer not yet read

    def check() -> None:
        for step, row in zip(log.tracker.snapshot(), gitea.rows, strict=True):
            if step.started_at is None and step.result == Result.UNSPECIFIED:
                assert row["status"] == "waiting"
            else:
                assert row == as_gitea_shows(step), step.id

    for op in ops:
        if op == "row":
            log.row("r", log.tracker.running)
        elif op == "shift":
            log.tracker.shift(log.next, 2)
            log.next += 2
        elif op in ("report", "taken-report"):
            if pending is not None:  # the answer to the previous one arrives only now
                log.tracker.confirm(pending)
                pending = None
            steps, receipt = log.tracker.report()
            gitea.update(steps)
            if op == "report":
                log.tracker.confirm(receipt)
                check()
            else:
                pending = receipt
        elif op == "lost-report":
            log.tracker.report()
        else:
            log.engine(op)
    log.tracker.close(T0, skipped=skipped)
    steps, receipt = log.tracker.report()
    gitea.update(steps)
    check()
