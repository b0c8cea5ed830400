"""What a job's sandbox says about the job: phase, and for a failure a diagnosis from the
closed set of `FailureReason`s (pure functions of what the OpenSandbox API answered).

OpenSandbox reports a state (`Pending`, `Running`, `Pausing`, `Paused`, `Resuming`,
`Stopping`, `Terminated`, `Failed`, or one it adds later), a reason code and a message; a
Docker-backed sandbox whose entrypoint exited says `Failed` with "exited with code N"
(`Terminated` for 0). The VM image's entrypoint exits with the executor's status, or with one
of its own when the job never reached the executor (vm/README.md): 66 nothing was delivered,
69 the SPIRE agent did not come up. Whether the executor was handed the job at all is the
sandbox's `dynrunner-stage`. An expired sandbox is removed by the server (404): what the
backend last saw of it (its expiry) tells an expiry from a deletion.

When the executor ended without finalizing its task, the entrypoint prints the task state
Gitea last accepted on the VM's console, which the server keeps after the VM ended (execd,
which reads the state file, ends with it): `accepted_state` reads it back.
"""

from __future__ import annotations

import base64
import re
import signal
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from dynrunner.controller.backends.base import Diagnosis, FailureReason, Observation, Phase
from dynrunner.controller.backends.opensandbox.builders import (
    KEY_STAGE,
    STAGE_CREATED,
    STAGE_DELIVERED,
    STATE_MARKER,
    stage_of,
)
from dynrunner.proto.gitea import TaskState

EXIT_NOT_DELIVERED = 66
EXIT_NO_AGENT = 69
DEADLINE_SLACK = timedelta(minutes=1)
"""As for every backend: a live executor this long past the job's deadline has overrun it."""
EXPIRY_SLACK = timedelta(seconds=5)
_EXIT = re.compile(r"exit(?:ed)? with (?:code|status) (-?\d+)", re.I)
UNSCHEDULABLE_REASONS = frozenset({"POD_PLATFORM_UNSCHEDULABLE"})
ENDED = frozenset({"Terminated", "Failed"})
PAUSED = frozenset({"Pausing", "Paused", "Resuming"})


@dataclass(frozen=True, slots=True)
class SandboxView:
    """One sandbox as the lifecycle API answers it (the fields the backend reads)."""

    id: str
    state: str
    reason: str = ""
    message: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    expires_at: datetime | None = None
    changed_at: datetime | None = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def delivered(self) -> bool:
        return self.metadata.get(KEY_STAGE) == STAGE_DELIVERED

    @property
    def exit_code(self) -> int | None:
        found = _EXIT.search(self.message)
        if found is None:
            return None
        code = int(found.group(1))
        return 128 - code if code < 0 else code  # a signal, as a runtime reports it (137: SIGKILL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _said(view: SandboxView) -> str:
    """What OpenSandbox said, for the detail."""
    return f"{view.state} {view.reason}: {view.message}".strip(": ")


def _hidden(observation: Observation, *views: SandboxView | None) -> Observation:
    """The diagnosis without the sandbox's id: it goes to the job log, and the id opens the
    sandbox's execd through the server's proxy route (docs/security.md, "MicroVMs")."""
    diagnosis = observation.diagnosis
    if diagnosis is None:
        return observation
    message, detail = diagnosis.message, diagnosis.detail
    for view in views:
        if view is not None and view.id:
            message, detail = message.replace(view.id, "<the VM>"), detail.replace(view.id, "<the VM>")
    return replace(observation, diagnosis=replace(diagnosis, message=message, detail=detail))


def ended(view: SandboxView) -> Observation:
    """A sandbox that is Terminated or Failed."""
    code = view.exit_code
    if view.state == "Terminated" and view.delivered:
        return Observation(Phase.SUCCEEDED, exit_code=0)
    detail = _said(view)
    if view.state == "Terminated":
        message = "The VM ended before the job was handed to it."
        return Observation(Phase.FAILED, Diagnosis(FailureReason.START_FAILED, message, detail), exit_code=code)
    if code == EXIT_NOT_DELIVERED:
        message = "The VM waited for its job, and none was delivered to it (the controller was away too long?)."
        return Observation(Phase.FAILED, Diagnosis(FailureReason.START_FAILED, message, detail), exit_code=code)
    if code == EXIT_NO_AGENT:
        message = (
            "The SPIRE agent in the VM did not come up: it could not join the trust domain with its join "
            "token (is the SPIRE server reachable from the VM, and the token still valid?)."
        )
        return Observation(Phase.FAILED, Diagnosis(FailureReason.START_FAILED, message, detail), exit_code=code)
    if code in (126, 127):
        what = "not found" if code == 127 else "not executable"
        message = f"The VM image's entrypoint or the executor could not be run ({what}, exit status {code})."
        return Observation(Phase.FAILED, Diagnosis(FailureReason.START_FAILED, message, detail), exit_code=code)
    if code is not None and code > 128:
        name = _signal_name(code - 128)
        memory = " (the VM may have run out of memory)" if code - 128 == signal.SIGKILL else ""
        message = f"The executor in the VM was killed by {name}{memory}."
        return Observation(Phase.FAILED, Diagnosis(FailureReason.KILLED, message, detail), exit_code=code)
    if view.reason in UNSCHEDULABLE_REASONS:
        message = f"The VM could not be placed: {view.message}"
        return Observation(Phase.FAILED, Diagnosis(FailureReason.UNSCHEDULABLE, message, detail), exit_code=code)
    if not view.delivered:
        said = f"exit status {code}" if code is not None else view.message or view.reason or "no reason given"
        message = f"The VM failed before the job was handed to it ({said})."
        return Observation(Phase.FAILED, Diagnosis(FailureReason.START_FAILED, message, detail), exit_code=code)
    if code is not None:
        message = f"The executor in the VM exited with status {code} before reporting the job's result."
    else:
        message = f"The VM failed while the job ran: {view.message or view.reason or 'no reason given'}."
    return Observation(Phase.FAILED, Diagnosis(FailureReason.EXECUTOR_FAILED, message, detail), exit_code=code)


def classify(
    view: SandboxView | None,
    *,
    deadline: datetime | None,
    now: datetime,
    start_timeout: timedelta,
    last_seen: SandboxView | None = None,
    deadline_grace: timedelta = DEADLINE_SLACK,
) -> Observation:
    """The phase of a job's sandbox (`view`; None when the API says it does not exist, with
    `last_seen` what the backend saw of it before, if anything); a diagnosis names no sandbox."""
    observed = _classify(
        view,
        deadline=deadline,
        now=now,
        start_timeout=start_timeout,
        last_seen=last_seen,
        deadline_grace=deadline_grace,
    )
    return _hidden(observed, view, last_seen)


def _classify(
    view: SandboxView | None,
    *,
    deadline: datetime | None,
    now: datetime,
    start_timeout: timedelta,
    last_seen: SandboxView | None = None,
    deadline_grace: timedelta = DEADLINE_SLACK,
) -> Observation:
    """The phase of a job's sandbox (`view`; None when the API says it does not exist, with
    `last_seen` what the backend saw of it before, if anything)."""
    if view is None:
        return Observation(Phase.GONE, vanished(last_seen, deadline=deadline, now=now))
    if view.ended:
        return ended(view)
    if view.delivered:
        if deadline is not None and now > deadline + deadline_grace:
            message = f"The job ran past its deadline ({deadline:%Y-%m-%d %H:%M:%S} UTC) and was stopped."
            return Observation(Phase.FAILED, Diagnosis(FailureReason.DEADLINE_EXCEEDED, message, _said(view)))
        return Observation(Phase.RUNNING)
    created = stage_of(view.metadata) == STAGE_CREATED
    if created and view.created_at is not None and now - view.created_at > start_timeout:
        seconds = int(start_timeout.total_seconds())
        said = f"{view.state}: {view.message or view.reason}" if view.message or view.reason else view.state
        message = f"The VM did not take its job within {seconds}s ({said})."
        return Observation(Phase.FAILED, Diagnosis(FailureReason.START_FAILED, message, _said(view)))
    return Observation(Phase.STARTING)


def vanished(last_seen: SandboxView | None, *, deadline: datetime | None, now: datetime) -> Diagnosis:
    """Why a job's sandbox no longer exists, as far as the backend can tell."""
    if last_seen is None:
        return Diagnosis(FailureReason.VANISHED, "The job's VM no longer exists (it expired or was deleted).")
    detail = _said(last_seen)
    expiry = last_seen.expires_at
    if expiry is not None and now + EXPIRY_SLACK >= expiry:
        when = f"{expiry:%Y-%m-%d %H:%M:%S} UTC"
        if deadline is not None and expiry >= deadline:
            message = f"The job's VM expired at {when}, past the job's deadline, while the job still ran."
            return Diagnosis(FailureReason.DEADLINE_EXCEEDED, message, detail)
        message = (
            f"The job's VM expired at {when}: it was not renewed in time "
            "(the controller was away for longer than the pool's leaseSeconds?)."
        )
        return Diagnosis(FailureReason.VANISHED, message, detail)
    return Diagnosis(FailureReason.VANISHED, "The job's VM was deleted outside dynrunner.", detail)


def accepted_state(console: str) -> TaskState | None:
    """The task state the entrypoint printed on the VM's console (`STATE_MARKER` and the state
    file's bytes in base64, vm/README.md): the last such line, wherever it starts (a server
    may prefix each line with a timestamp). None when there is none, or when it does not
    decode (cut short, or a job's forgery: it can misstate only its own task's steps)."""
    for line in reversed(console.splitlines()):
        _, marker, payload = line.partition(STATE_MARKER)
        if not marker:
            continue
        try:
            data = base64.b64decode(payload.strip(), validate=True)
            return TaskState.decode(data) if data else None
        except (ValueError, OverflowError):  # binascii.Error is a ValueError
            return None
    return None


def without_state(console: str) -> str:
    """`console` without the entrypoint's state lines: they are for the controller, not a job log."""
    return "\n".join(line for line in console.splitlines() if STATE_MARKER not in line)
