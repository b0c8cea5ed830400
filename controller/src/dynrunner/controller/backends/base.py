"""The one seam between the controller's flow and the places jobs run (DESIGN §4).

A backend makes one environment per assignment and tells the controller how it is doing.
The handshake (docs/backends.md, "The handshake"):

1. `create` makes the environment's objects — idempotently by assignment id, completing a
   half-made one — and returns once they exist; the launcher then acknowledges the delivery
   and frees its launch slot.
2. `follow_start` reports the start as it happens (scheduled, pulling, pulled, executor
   started, or why it never will); the launcher writes each event's line into the job log
   and heartbeats the task until the executor runs. A backend that starts the executor
   itself (local) does so only when the launcher asks for the event after `STARTING`.
3. `observe` classifies an environment (phase, and a `Diagnosis` from a closed set when it
   ended without its executor finalizing the task); `delete` removes it; `list_owned` and
   `find` find environments by the `dynrunner.io/*` labels, so a restarted controller
   recovers by listing.
4. A backend that can watch (`Watches`) wakes the reaper when an environment changes,
   instead of the reaper polling every environment every second.

What the controller needs to finalize a task whose environment is gone (the runner's
credential, the task id, the values to mask) is kept by the controller in a sealed finalize
record outside the environment: a backend never has to give an assignment back.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from dynrunner.controller import contract
from dynrunner.proto.assignment import Assignment
from dynrunner.proto.gitea import TaskState


class Phase(enum.Enum):
    STARTING = "starting"
    """Created; the executor is not running yet (e.g. a Pod pulling its image)."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    """The executor ended after finalizing its task: only deleting is left."""
    FAILED = "failed"
    """It ended, or can never run, without the executor finalizing: the controller must."""
    GONE = "gone"
    """It no longer exists (deleted behind the controller's back, its node lost): the
    controller finalizes the task from its finalize record, with the diagnosis if the backend
    can tell why (else: the environment disappeared)."""

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.GONE)


class FailureReason(enum.StrEnum):
    """Why an environment ended without its executor finalizing (stable: metric label values)."""

    START_FAILED = "start-failed"
    """The executor could not be started (missing program, image pull error, bad spec)."""
    EXECUTOR_FAILED = "executor-failed"
    """The executor exited unsuccessfully before reporting the job's result."""
    KILLED = "killed"
    """The executor was killed by a signal."""
    OUT_OF_MEMORY = "out-of-memory"
    EVICTED = "evicted"
    UNSCHEDULABLE = "unschedulable"
    DEADLINE_EXCEEDED = "deadline-exceeded"
    """Still running past the job's deadline plus grace."""
    VANISHED = "vanished"
    """The environment disappeared, or its process is gone without an exit status."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    reason: FailureReason
    message: str
    """One or two sentences for the job log, saying what happened in the user's terms."""
    detail: str = ""
    """Extra evidence (e.g. the executor's last output lines); mask secrets before showing it."""
    detail_heading: str = "last lines of the executor's output:"
    """The line shown before `detail` (another container's evidence says whose it is)."""


@dataclass(frozen=True, slots=True)
class Observation:
    phase: Phase
    diagnosis: Diagnosis | None = None
    exit_code: int | None = None
    ready_at: datetime | None = None
    """When the executor took over the task (reached Gitea), if the backend can tell."""
    reported: TaskState | None = None
    """What Gitea last accepted of the task's state from the executor (its result once it
    finalized, every step it reported), if the backend can tell: the executor keeps it in the
    file `DYNRUNNER_STATE_FILE` names (local; a VM's, read through execd while it runs, or from
    its console, where the entrypoint printed it after the executor died) and in a Pod's
    termination message (`dynrunner.proto.accepted`). Read only for an environment that ended;
    the reaper's final step states come from it (`reporting.finalize.final_steps`)."""
    identity_wait_s: float | None = None
    """How long the executor waited for its workload identity, if the backend can tell (for
    `dynrunner_identity_wait_seconds`)."""


@dataclass(frozen=True, slots=True)
class Environment:
    """A handle on one environment: what it is called and the labels it carries."""

    backend: str
    name: str
    labels: Mapping[str, str]
    created_at: datetime
    deadline: datetime | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    """Backend-specific coordinates (a namespace, a directory), for logs and the backend itself."""

    @property
    def assignment_id(self) -> str:
        return self.labels[contract.LABEL_ASSIGNMENT_ID]

    @property
    def task_id(self) -> int:
        return int(self.labels[contract.LABEL_TASK_ID])

    @property
    def pool(self) -> str:
        return self.labels[contract.LABEL_POOL]

    @property
    def stream_seq(self) -> int | None:
        """The stream sequence of the assignment message it was made for, if recorded."""
        value = self.labels.get(contract.LABEL_STREAM_SEQ, "")
        return int(value) if value.isdigit() else None


class StartStage(enum.Enum):
    """Where an environment's start is (`StartEvent.stage`)."""

    PROGRESS = "progress"
    """A step toward the start: created, scheduled on a node, pulling an image, image pulled."""
    STARTING = "starting"
    """The backend starts the executor itself next (local, sandboxes), and does so when the
    consumer asks for the following event — after it wrote this event's line. Closing the
    iterator instead (the task ended meanwhile) leaves the executor unstarted."""
    STARTED = "started"
    """The executor runs: from now on it alone writes the job log and reports the task."""
    FAILED = "failed"
    """The executor will never start here; `diagnosis` says why. The reaper finalizes the task
    (`observe` reports the same failure)."""

    @property
    def final(self) -> bool:
        return self in (StartStage.STARTED, StartStage.FAILED)


@dataclass(frozen=True, slots=True)
class StartEvent:
    """One step of an environment's start, as `Backend.follow_start` reports it."""

    stage: StartStage
    line: str = ""
    """A stage line for the job log, in the user's words ("pod scheduled on node n1", "image
    pulled in 12.3s"); "" writes nothing. The line of a `STARTED` event is never written (the
    executor owns the log by then): it goes to the controller's log only."""
    diagnosis: Diagnosis | None = None
    """Why it failed, for `FAILED`."""
    at: datetime | None = None
    """When it happened, if the backend knows (else: when it was seen)."""


Wake = Callable[[str | None], None]
"""Called by a watching backend when the environment of an assignment id may have changed
phase (None: any of them may have). Cheap and synchronous; the reaper coalesces wakes."""


class Backend(Protocol):
    """One pool's environments. Implementations: `backends/<name>/`, chosen by `registry`.

    Every method may be called concurrently with the others (the launcher, the start
    followers and the reaper share one backend object) and after a controller restart by a
    new backend object that never saw the environment made: what a method needs, it reads
    from the environment (its labels, its objects), not from memory.
    """

    name: str

    async def create(self, assignment: Assignment, *, stream_seq: int | None = None) -> Environment:
        """Make the environment's objects and return once they exist; do not wait for the
        executor to start (`follow_start` reports that).

        The assignment (with its unsealed credentials) reaches the executor through the
        environment's own secret channel (a Secret owned by the Pod, a file in the sandbox, a
        0600 file), never labels, annotations or environment values. Idempotent by
        assignment id: the name is `contract.environment_name(assignment_id)`, "already
        exists" is success, concurrent calls for one assignment make one environment, and a
        half-made environment (a Secret without its Pod, a directory without its metadata)
        is completed. Labels: `contract.environment_labels(assignment, stream_seq)`, where
        `stream_seq` is the JetStream sequence of the assignment's message (the reaper leaves
        a failed environment alone while that message is unacknowledged: its launch was
        interrupted and the redelivery resumes it). Raises (BackendError with a message for
        the user, or any error) when the objects cannot be made: the launcher retries."""
        ...

    def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:
        """The environment's start, from where it is now: `PROGRESS` events, at most one
        `STARTING`, then one final event (`STARTED` or `FAILED`), after which the iterator
        ends.

        Called for a new environment right after `create`, and again for one still starting
        after a controller restart (by a new backend object): it picks up from the
        environment's state, so lines already written may come again; an environment whose
        executor runs or ran yields `STARTED` at once, one that can no longer start `FAILED`.
        It never waits forever: the backend bounds every wait it knows (an image pull, a
        node that never comes, the environment vanishing) and ends with `FAILED`. The
        consumer handles each event before it asks for the next, and may close the iterator
        at any point (it then no longer follows; nothing is undone)."""
        ...

    async def find(self, assignment_id: str) -> Environment | None:
        """The environment of that assignment, if it exists."""
        ...

    async def list_owned(self) -> list[Environment]:
        """Every environment of this backend's pool, found by its labels."""
        ...

    async def observe(self, env: Environment) -> Observation:
        """Its phase now; for `FAILED` (and `GONE` where the backend can tell why) a
        `Diagnosis` from the closed set of `FailureReason`, made by a pure classifier."""
        ...

    async def delete(self, env: Environment) -> None:
        """Stop the executor if it still runs and remove the environment with everything it
        owns. Deleting what does not exist is success."""
        ...

    async def collect_orphans(self, launching: Collection[str]) -> list[str]:
        """Remove leftovers that belong to no environment (except assignment ids in
        `launching`, being created right now); returns what was removed, for the log."""
        ...

    async def aclose(self) -> None:
        """Release clients. Never stops running environments."""
        ...


@runtime_checkable
class Watches(Protocol):
    """A backend that keeps a live view of its environments (a list-and-watch, process exit
    notifications) and says when one changed, so the reaper needs no per-environment polling."""

    async def watch(self, wake: Wake) -> None:
        """Watch the pool's environments until cancelled, calling `wake(assignment_id)` when one
        may have changed phase (created, started, ended, vanished) and `wake(None)` when the
        backend lost track (e.g. it had to list again). Time-based changes (a deadline or a
        start that times out) are the backend's to notice too.

        The controller runs it in its task group under `supervise` (an error is logged and it
        is started again with backoff), from before its first call of another method until
        after the last. Methods that answer from what the watch has seen wait for its first
        sync (bounded: BackendError when it does not come)."""
        ...


@dataclass(frozen=True, slots=True)
class Isolation:
    """How a backend keeps jobs contained and apart on this machine, in words."""

    summary: str
    warnings: tuple[str, ...] = ()
    """What it cannot do here that a user would expect (one line each)."""


@runtime_checkable
class ReportsIsolation(Protocol):
    """A backend whose isolation depends on the machine; said at start and by `check`."""

    def isolation(self) -> Isolation: ...


class BackendError(Exception):
    """Creating or handling an environment failed; the message is shown to the user."""


class JobRefused(BackendError):
    """The job itself cannot run in this pool (e.g. its `services:` cannot be built): no
    attempt would do better, so the launcher finalizes the task at once with this message."""
