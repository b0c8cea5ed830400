"""The local backend's state, classified from facts read off the environment directory.

Pure: the backend gathers `Facts` (the exit status the wrapper recorded, whether the
process it recorded is alive, times), `classify` turns them into an Observation with a
diagnosis from the closed set in `backends.base.FailureReason`.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from datetime import datetime, timedelta

from dynrunner.controller.backends.base import Diagnosis, FailureReason, Observation, Phase

FINALIZED_EXIT_CODES = frozenset({0})
"""Exit statuses with which `dynrunner-executor run` says it reported the task's final
state to Gitea (whatever the job's result). Any other status: the controller finalizes."""

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_SETUP_FAILED = 125
"""The wrapper could not set up the job's environment (its cgroup, its workspace)."""
SIGNAL_BASE = 128


@dataclass(frozen=True, slots=True)
class Facts:
    exists: bool
    created_at: datetime
    now: datetime
    exit_code: int | None = None
    """What the wrapper recorded after the executor exited (shell convention: 128+N = signal N)."""
    pid: int | None = None
    """The wrapper's pid, once it recorded it."""
    started_at: datetime | None = None
    """When the wrapper was spawned (by whoever followed the start); None while it was not."""
    start_error: str | None = None
    """Why it could not be spawned."""
    alive: bool = False
    executor_alive: bool = False
    """The executor's own process lives (it may outlive a wrapper that was killed alone)."""
    deadline: datetime | None = None
    deadline_grace: timedelta = timedelta(minutes=1)
    start_grace: timedelta = timedelta(seconds=30)
    command: str = "the executor"


def classify(facts: Facts) -> Observation:
    if not facts.exists:
        return Observation(Phase.GONE, Diagnosis(FailureReason.VANISHED, "the job's environment directory was removed"))
    if facts.exit_code is not None:
        if facts.exit_code in FINALIZED_EXIT_CODES:
            return Observation(Phase.SUCCEEDED, exit_code=facts.exit_code)
        return Observation(Phase.FAILED, exit_status_diagnosis(facts.exit_code, facts.command), facts.exit_code)
    if facts.pid is None:
        return _not_started(facts)
    if not facts.alive and not facts.executor_alive:
        return Observation(
            Phase.FAILED,
            Diagnosis(
                FailureReason.VANISHED,
                "the executor's process disappeared without recording an exit status "
                "(its wrapper was killed, or the machine restarted)",
            ),
        )
    if facts.deadline is not None and facts.now > facts.deadline + facts.deadline_grace:
        return Observation(
            Phase.FAILED,
            Diagnosis(
                FailureReason.DEADLINE_EXCEEDED,
                f"the job was still running {_ago(facts.now - facts.deadline)} after its deadline "
                f"({facts.deadline.isoformat(timespec='seconds')}); the controller stopped it",
            ),
        )
    return Observation(Phase.RUNNING)


def _not_started(facts: Facts) -> Observation:
    """No wrapper yet. Before its start was taken it waits for a follower (the launcher's, or
    the reaper's after a restart), at most until the job's deadline; after, for the wrapper
    to record itself, at most the start grace."""
    if facts.start_error is not None:
        return Observation(Phase.FAILED, Diagnosis(FailureReason.START_FAILED, facts.start_error))
    if facts.started_at is None:
        if facts.deadline is not None and facts.now > facts.deadline + facts.deadline_grace:
            return Observation(
                Phase.FAILED,
                Diagnosis(FailureReason.START_FAILED, "the executor was never started before the job's deadline"),
            )
        return Observation(Phase.STARTING)
    if facts.now - facts.started_at > facts.start_grace:
        return Observation(
            Phase.FAILED,
            Diagnosis(FailureReason.START_FAILED, "the executor was never started in the job's environment"),
        )
    return Observation(Phase.STARTING)


def exit_status_diagnosis(code: int, command: str = "the executor") -> Diagnosis:
    if code == EXIT_NOT_FOUND:
        return Diagnosis(FailureReason.START_FAILED, f"{command} could not be started: program not found (exit 127)")
    if code == EXIT_NOT_EXECUTABLE:
        return Diagnosis(FailureReason.START_FAILED, f"{command} could not be started: not executable (exit 126)")
    if code == EXIT_SETUP_FAILED:
        return Diagnosis(
            FailureReason.START_FAILED, f"the job's environment could not be set up, so {command} never started"
        )
    if code > SIGNAL_BASE:
        number = code - SIGNAL_BASE
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        hint = " (out of memory, or stopped by an operator)" if number == signal.SIGKILL else ""
        return Diagnosis(
            FailureReason.KILLED,
            f"the executor was killed by {name}{hint} before it reported the job's result",
        )
    return Diagnosis(
        FailureReason.EXECUTOR_FAILED,
        f"the executor exited with status {code} before it reported the job's result",
    )


def _ago(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    return f"{seconds // 60}m"
