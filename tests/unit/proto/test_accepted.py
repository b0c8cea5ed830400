"""The accepted task state in the short form a termination message carries: what the final
UpdateTask needs survives the round trip, and a job too big for 4096 bytes loses no step that
may have run to `skipped`."""

from __future__ import annotations

from datetime import UTC, datetime

from dynrunner.proto.accepted import MESSAGE_LIMIT, decode, dumps, encode
from dynrunner.proto.gitea import Result, StepState, TaskState

START = datetime(2026, 12, 2, 10, 0, 7, 250000, tzinfo=UTC)


def test_each_steps_result_and_the_start_of_the_running_one_survive() -> None:
    state = TaskState(
        id=7,
        steps=[
            StepState(0, Result.SUCCESS, START, START, log_index=0, log_length=3),
            StepState(1, Result.SKIPPED),
            StepState(2, started_at=START, log_index=3, log_length=9),
            StepState(4, Result.FAILURE, START, START),
        ],
    )
    doc = encode(state)
    assert doc == {"result": "", "steps": "skr-f", "started": {"2": int(START.timestamp())}}
    back = decode(dumps(doc))
    assert back is not None and back.result is Result.UNSPECIFIED
    assert back.steps == [
        StepState(0, Result.SUCCESS),
        StepState(1, Result.SKIPPED),
        StepState(2, started_at=START.replace(microsecond=0)),
        StepState(3),
        StepState(4, Result.FAILURE),
    ]


def test_the_tasks_result_once_finalized_survives() -> None:
    back = decode(dumps(encode(TaskState(id=1, result=Result.FAILURE, steps=[StepState(0, Result.FAILURE)]))))
    assert back is not None and back.result is Result.FAILURE


def test_other_keys_of_the_message_are_ignored() -> None:
    back = decode(dumps({**encode(TaskState(id=1, steps=[StepState(0, Result.SUCCESS)])), "identityWaitSeconds": 2.5}))
    assert back is not None and [s.result for s in back.steps] == [Result.SUCCESS]


def test_what_is_not_a_state_reads_as_none() -> None:
    for text in ("", "Traceback (most recent call last):\n  boom", '{"identityWaitSeconds": 1.5}', '{"steps": "s'):
        assert decode(text) is None, text
    assert decode('{"steps": "sx"}') is None
    assert decode('{"steps": "r", "started": {}}') is None


def test_a_job_too_big_for_the_limit_keeps_its_first_steps_and_the_rest_read_cancelled() -> None:
    count = 6000
    steps = [StepState(i, Result.SUCCESS) for i in range(count - 1)] + [StepState(count - 1, started_at=START)]
    doc = encode(TaskState(id=1, steps=steps))
    text = dumps(doc)
    assert len(text.encode()) <= MESSAGE_LIMIT - 100  # room for the executor's summary
    back = decode(text)
    assert back is not None and len(back.steps) == count
    kept = len(doc["steps"])
    assert 3000 < kept < count
    assert {s.result for s in back.steps[:kept]} == {Result.SUCCESS}
    assert {s.result for s in back.steps[kept:]} == {Result.CANCELLED}


def test_a_job_that_fits_is_not_cut() -> None:
    steps = [StepState(i, Result.SUCCESS) for i in range(1000)]
    doc = encode(TaskState(id=1, steps=steps))
    assert "count" not in doc and len(doc["steps"]) == 1000
