"""The step states the controller sends when it ends a task itself (issue 10 item 6)."""

from __future__ import annotations

from datetime import UTC, datetime

from dynrunner.controller.reporting.finalize import final_steps
from dynrunner.proto.gitea import Result, StepState

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
EARLIER = datetime(2026, 1, 2, 3, 0, 0, tzinfo=UTC)


def test_finished_steps_stay_as_reported_the_running_one_is_cancelled_the_rest_skipped() -> None:
    reported = [
        StepState(0, Result.SUCCESS, EARLIER, EARLIER, log_index=0, log_length=4),
        StepState(1, Result.UNSPECIFIED, EARLIER, None, log_index=4, log_length=9),
        StepState(3, Result.SKIPPED, None, EARLIER, log_index=13, log_length=0),
    ]
    steps = final_steps(5, reported, NOW)
    assert steps == [
        StepState(0, Result.SUCCESS, EARLIER, EARLIER, 0, 4),
        StepState(1, Result.CANCELLED, EARLIER, NOW, 4, 9),
        StepState(2, Result.SKIPPED),
        StepState(3, Result.SKIPPED, None, EARLIER, 13, 0),
        StepState(4, Result.SKIPPED),
    ]
    assert steps[0] is not reported[0]  # copies: the caller's report is left alone


def test_nothing_reported_yet_means_no_step_ran() -> None:
    assert final_steps(2, [], NOW) == [StepState(0, Result.SKIPPED), StepState(1, Result.SKIPPED)]


def test_without_the_executor_s_report_every_step_is_cancelled_keeping_what_gitea_stored() -> None:
    """Zero times and log ranges leave Gitea's stored values alone; only the status changes."""
    assert final_steps(2, None, NOW) == [StepState(0, Result.CANCELLED), StepState(1, Result.CANCELLED)]


def test_a_job_whose_steps_could_not_be_read_gets_the_reported_ones() -> None:
    reported = [StepState(0, Result.FAILURE, EARLIER, EARLIER, 0, 2)]
    assert final_steps(0, reported, NOW) == reported
    assert final_steps(0, None, NOW) == []
