"""What a job's sandbox says about the job (pure): states, exit statuses of the VM's
entrypoint and executor, start timeouts, deadlines, expiry and deletion."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest

from dynrunner.controller.backends.base import FailureReason, Phase
from dynrunner.controller.backends.opensandbox.builders import STATE_MARKER
from dynrunner.controller.backends.opensandbox.diagnosis import SandboxView, accepted_state, classify, without_state
from dynrunner.proto.gitea import Result, StepState, TaskState

T0 = datetime(2026, 1, 1, tzinfo=UTC)
START = timedelta(seconds=600)


def box(state: str, stage: str = "delivered", message: str = "", *, at: int = 0, **extra: object) -> SandboxView:
    return SandboxView(
        "sb-1",
        state,
        reason=str(extra.pop("reason", "")),
        message=message,
        metadata={"dynrunner-stage": stage},
        created_at=T0 + timedelta(seconds=at),
        **extra,  # type: ignore[arg-type]
    )


def _classify(view: SandboxView | None, now: int = 10, deadline: int | None = None, **kw: object) -> object:
    return classify(
        view,
        deadline=T0 + timedelta(seconds=deadline) if deadline is not None else None,
        now=T0 + timedelta(seconds=now),
        start_timeout=START,
        **kw,  # type: ignore[arg-type]
    )


def exited(code: int, stage: str = "delivered") -> SandboxView:
    return box("Failed", stage, f"Sandbox container exited with code {code}.", reason="CONTAINER_EXITED_ERROR")


@pytest.mark.parametrize(
    ("view", "phase"),
    [
        (box("Pending", "created"), Phase.STARTING),
        (box("Running", "created"), Phase.STARTING),
        (box("Running", "staged"), Phase.STARTING),
        (box("Running"), Phase.RUNNING),
        (box("Paused"), Phase.RUNNING),
        (box("Terminated", message="Sandbox container exited successfully."), Phase.SUCCEEDED),
    ],
)
def test_states(view: SandboxView, phase: Phase) -> None:
    assert _classify(view).phase is phase  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("view", "reason", "words"),
    [
        (exited(3), FailureReason.EXECUTOR_FAILED, "exited with status 3"),
        (exited(1), FailureReason.EXECUTOR_FAILED, "before reporting"),
        (exited(137), FailureReason.KILLED, "SIGKILL (the VM may have run out of memory)"),
        (exited(-15), FailureReason.KILLED, "SIGTERM"),
        (exited(127, "staged"), FailureReason.START_FAILED, "not found"),
        (exited(126), FailureReason.START_FAILED, "not executable"),
        (exited(66, "staged"), FailureReason.START_FAILED, "none was delivered"),
        (exited(69), FailureReason.START_FAILED, "SPIRE agent in the VM did not come up"),
        (exited(2, "staged"), FailureReason.START_FAILED, "before the job was handed to it (exit status 2)"),
        (box("Terminated", "staged"), FailureReason.START_FAILED, "ended before the job was handed"),
        (
            box("Failed", "created", "no node fits", reason="POD_PLATFORM_UNSCHEDULABLE"),
            FailureReason.UNSCHEDULABLE,
            "could not be placed: no node fits",
        ),
        (box("Failed", "delivered", "1 sandbox task(s) failed"), FailureReason.EXECUTOR_FAILED, "task(s) failed"),
        (
            box("Failed", "created", "pod sb-1 fits no node", reason="POD_PLATFORM_UNSCHEDULABLE"),
            FailureReason.UNSCHEDULABLE,
            "could not be placed: pod <the VM> fits no node",
        ),
    ],
)
def test_failures_are_diagnosed(view: SandboxView, reason: FailureReason, words: str) -> None:
    obs = _classify(view)
    assert obs.phase is Phase.FAILED and obs.diagnosis.reason is reason, obs  # type: ignore[attr-defined]
    assert words in obs.diagnosis.message  # type: ignore[attr-defined]
    assert view.state in obs.diagnosis.detail  # type: ignore[attr-defined]
    # What the job log shows names no sandbox: its id opens its execd (docs/security.md).
    assert "sb-1" not in obs.diagnosis.message + obs.diagnosis.detail  # type: ignore[attr-defined]


def test_a_vm_that_does_not_take_its_job_within_the_start_timeout_failed_to_start() -> None:
    pending = box("Pending", "created", "Pod is scheduled but waiting for IP")
    assert _classify(pending, now=599).phase is Phase.STARTING  # type: ignore[attr-defined]
    late = _classify(pending, now=601)
    assert late.phase is Phase.FAILED and late.diagnosis.reason is FailureReason.START_FAILED  # type: ignore[attr-defined]
    assert "within 600s (Pending: Pod is scheduled but waiting for IP)" in late.diagnosis.message  # type: ignore[attr-defined]
    # once staged, the VM waits for its start (the entrypoint gives up by itself: exit 66)
    assert _classify(box("Running", "staged"), now=3600).phase is Phase.STARTING  # type: ignore[attr-defined]


def test_a_running_job_past_its_deadline_is_deadline_exceeded() -> None:
    assert _classify(box("Running"), now=100, deadline=60).phase is Phase.RUNNING  # type: ignore[attr-defined]
    late = _classify(box("Running"), now=121, deadline=60)
    assert late.diagnosis.reason is FailureReason.DEADLINE_EXCEEDED  # type: ignore[attr-defined]


def test_a_vanished_sandbox_is_gone_and_an_expiry_is_told_from_a_deletion() -> None:
    unknown = _classify(None)
    assert unknown.phase is Phase.GONE and "expired or was deleted" in unknown.diagnosis.message  # type: ignore[attr-defined]
    seen = box("Running", expires_at=T0 + timedelta(seconds=1200))
    deleted = _classify(None, now=300, last_seen=seen)
    assert deleted.diagnosis.reason is FailureReason.VANISHED  # type: ignore[attr-defined]
    assert "deleted outside dynrunner" in deleted.diagnosis.message  # type: ignore[attr-defined]
    expired = _classify(None, now=1201, last_seen=seen)
    assert "expired at 2026-01-01 00:20:00 UTC: it was not renewed" in expired.diagnosis.message  # type: ignore[attr-defined]
    overran = _classify(None, now=1201, deadline=600, last_seen=seen)
    assert overran.diagnosis.reason is FailureReason.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    assert "past the job's deadline" in overran.diagnosis.message  # type: ignore[attr-defined]


# -- the accepted state on the console (issue 18 item 7) ------------------------------------------

KEPT = TaskState(
    7,
    steps=[
        StepState(0, Result.SUCCESS, started_at=T0, stopped_at=T0, log_index=0, log_length=2),
        StepState(1, started_at=T0 + timedelta(seconds=1)),
    ],
)


def marker(state: TaskState | bytes) -> str:
    data = state if isinstance(state, bytes) else state.encode()
    return STATE_MARKER + base64.b64encode(data).decode()


@pytest.mark.parametrize(
    "console",
    [
        f"executor: step 1\n{marker(KEPT)}\n",
        # Docker's logs carry a timestamp before each line; an agent may speak after it.
        f"2026-01-01T00:00:00.000000001Z {marker(KEPT)}\r\n2026-01-01T00:00:01Z agent: stopped\n",
        f"{marker(TaskState(7, steps=[StepState(0, started_at=T0)]))}\n{marker(KEPT)}",  # the last one
    ],
)
def test_the_last_state_line_on_the_console_is_the_accepted_state(console: str) -> None:
    assert accepted_state(console) == KEPT


@pytest.mark.parametrize(
    "console",
    [
        "",
        "dynrunner-vm-entrypoint: the SPIRE agent did not open its socket\n",
        STATE_MARKER + "\n",  # an empty file
        marker(KEPT)[:-7] + "\n",  # cut short
        STATE_MARKER + "not base64!\n",
        marker(b"\xff\xff\xff\xff") + "\n",  # base64, but no TaskState
        f"{marker(KEPT)}\n{STATE_MARKER}garbage\n",  # the last one is malformed: none of them
    ],
)
def test_a_console_without_a_whole_state_line_gives_none(console: str) -> None:
    assert accepted_state(console) is None


def test_the_state_lines_are_kept_out_of_what_the_job_log_shows() -> None:
    assert without_state(f"one\n{marker(KEPT)}\ntwo\n") == "one\ntwo"
