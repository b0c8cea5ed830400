"""The local backend's pure state classifier."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dynrunner.controller.backends.base import FailureReason, Phase
from dynrunner.controller.backends.local.diagnosis import Facts, classify

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def facts(**kw: object) -> Facts:
    base: dict[str, object] = {"exists": True, "created_at": NOW - timedelta(seconds=5), "now": NOW}
    base.update(kw)
    return Facts(**base)  # type: ignore[arg-type]


def test_gone() -> None:
    obs = classify(facts(exists=False))
    assert obs.phase is Phase.GONE


def test_finalized_exit() -> None:
    obs = classify(facts(exit_code=0, pid=10))
    assert obs.phase is Phase.SUCCEEDED and obs.diagnosis is None


@pytest.mark.parametrize(
    ("code", "reason", "text"),
    [
        (1, FailureReason.EXECUTOR_FAILED, "exited with status 1"),
        (3, FailureReason.EXECUTOR_FAILED, "status 3"),
        (127, FailureReason.START_FAILED, "not found"),
        (126, FailureReason.START_FAILED, "not executable"),
        (137, FailureReason.KILLED, "SIGKILL (out of memory"),
        (143, FailureReason.KILLED, "SIGTERM"),
    ],
)
def test_unfinalized_exits(code: int, reason: FailureReason, text: str) -> None:
    obs = classify(facts(exit_code=code, pid=10))
    assert obs.phase is Phase.FAILED
    assert obs.diagnosis is not None and obs.diagnosis.reason is reason
    assert text in obs.diagnosis.message


def test_spawned_then_never_started() -> None:
    assert classify(facts(started_at=NOW - timedelta(seconds=5))).phase is Phase.STARTING
    late = classify(facts(started_at=NOW - timedelta(minutes=5)))
    assert late.phase is Phase.FAILED and late.diagnosis is not None
    assert late.diagnosis.reason is FailureReason.START_FAILED
    assert "never started" in late.diagnosis.message


def test_a_start_nobody_took_waits_for_its_follower_until_the_deadline() -> None:
    """The controller died after creating the environment: the start is followed again after
    the restart, however long that takes — but not past the job's deadline."""
    waiting = facts(created_at=NOW - timedelta(hours=1), deadline=NOW + timedelta(hours=1))
    assert classify(waiting).phase is Phase.STARTING
    assert classify(facts(created_at=NOW - timedelta(hours=1))).phase is Phase.STARTING
    late = classify(facts(created_at=NOW - timedelta(hours=3), deadline=NOW - timedelta(hours=1)))
    assert late.phase is Phase.FAILED and late.diagnosis is not None
    assert late.diagnosis.reason is FailureReason.START_FAILED
    assert "deadline" in late.diagnosis.message


def test_a_wrapper_that_could_not_be_spawned_is_start_failed_at_once() -> None:
    obs = classify(facts(started_at=NOW, start_error="could not start the executor: [Errno 2] /bin/sh"))
    assert obs.phase is Phase.FAILED and obs.diagnosis is not None
    assert obs.diagnosis.reason is FailureReason.START_FAILED and "/bin/sh" in obs.diagnosis.message


def test_running_and_vanished() -> None:
    assert classify(facts(pid=10, alive=True)).phase is Phase.RUNNING
    # A wrapper killed on its own: the executor it started works on.
    assert classify(facts(pid=10, alive=False, executor_alive=True)).phase is Phase.RUNNING
    vanished = classify(facts(pid=10, alive=False))
    assert vanished.phase is Phase.FAILED and vanished.diagnosis is not None
    assert vanished.diagnosis.reason is FailureReason.VANISHED


def test_deadline_with_grace() -> None:
    within = classify(facts(pid=10, alive=True, deadline=NOW - timedelta(seconds=30)))
    assert within.phase is Phase.RUNNING
    past = classify(facts(pid=10, alive=True, deadline=NOW - timedelta(minutes=3)))
    assert past.phase is Phase.FAILED and past.diagnosis is not None
    assert past.diagnosis.reason is FailureReason.DEADLINE_EXCEEDED
    assert "after its deadline" in past.diagnosis.message


def test_reason_values_are_stable() -> None:
    assert {r.value for r in FailureReason} >= {
        "start-failed",
        "executor-failed",
        "killed",
        "deadline-exceeded",
        "vanished",
    }
