"""The step states the controller sends when it ends a task itself (issue 10 item 6)."""

from __future__ import annotations

from datetime import UTC, datetime

from dynrunner.controller.reporting.finalize import final_steps
from dynrunner.proto.accepted import decode, dumps, encode
from dynrunner.proto.gitea import Result, StepState, TaskState

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


def test_the_short_form_of_a_termination_message_gives_the_same_final_steps() -> None:
    """A Pod's accepted state carries no log ranges or stop times (Gitea keeps those): its
    final steps differ from the full state's only in the zero fields Gitea leaves alone."""
    full = TaskState(
        1,
        steps=[
            StepState(0, Result.SUCCESS, EARLIER, EARLIER, log_index=0, log_length=4),
            StepState(1, Result.UNSPECIFIED, EARLIER, None, log_index=4, log_length=9),
        ],
    )
    short = decode(dumps(encode(full)))
    assert short is not None
    assert final_steps(3, short.steps, NOW) == [
        StepState(0, Result.SUCCESS),
        StepState(1, Result.CANCELLED, EARLIER, NOW),
        StepState(2, Result.SKIPPED),
    ]


def test_steps_a_too_long_message_left_out_are_cancelled_not_skipped() -> None:
    full = TaskState(1, steps=[StepState(i, Result.SUCCESS) for i in range(6000)])
    short = decode(dumps(encode(full)))
    assert short is not None
    steps = final_steps(6000, short.steps, NOW)
    assert steps[0].result is Result.SUCCESS and steps[-1].result is Result.CANCELLED
    assert Result.SKIPPED not in {step.result for step in steps}
