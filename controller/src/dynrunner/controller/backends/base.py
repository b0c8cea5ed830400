"""The one seam between the controller's flow and the places jobs run (DESIGN §4).

A backend creates one environment per assignment, idempotently (the name derives from the
assignment id, "already exists" is success), finds it again by assignment id, lists the
environments it owns (by the `dynrunner.io/*` labels), observes their state — with a
diagnosis from a closed set of failure reasons when one ended without its executor
finalizing the task — and deletes them (not found is success). Everything the controller
knows about a running job is on the environment itself, so a restarted controller
recovers by listing.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from dynrunner.controller import contract
from dynrunner.proto.assignment import Assignment


class Phase(enum.Enum):
    STARTING = "starting"
    """Created; the executor is not running yet (e.g. a Pod pulling its image)."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    """The executor ended after finalizing its task: only deleting is left."""
    FAILED = "failed"
    """It ended, or can never run, without the executor finalizing: the controller must."""
    GONE = "gone"
    """It no longer exists."""

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


@dataclass(frozen=True, slots=True)
class Observation:
    phase: Phase
    diagnosis: Diagnosis | None = None
    exit_code: int | None = None
    ready_at: datetime | None = None
    """When the executor took over the task (reached Gitea), if the backend can tell."""


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


BeforeStart = Callable[[], Awaitable[None]]
"""Awaited by a backend right before the executor may start (the launcher writes its last
stage line and stops heartbeating there)."""


class Backend(Protocol):
    """One pool's environments. Implementations: `backends/<name>/`, chosen by `registry`."""

    name: str

    async def create(
        self, assignment: Assignment, before_start: BeforeStart, *, stream_seq: int | None = None
    ) -> Environment:
        """Create (or find, if it exists) the environment for `assignment` and start its
        executor with the assignment handed over through the environment's own secret
        channel. Idempotent by assignment id. `stream_seq` (the JetStream sequence of the
        assignment's message) is recorded with the environment: `contract.environment_labels`."""
        ...

    async def find(self, assignment_id: str) -> Environment | None: ...

    async def list_owned(self) -> list[Environment]:
        """Every environment of this backend's pool."""
        ...

    async def observe(self, env: Environment) -> Observation: ...

    async def load_assignment(self, env: Environment) -> Assignment:
        """The assignment as handed to the executor (with its credentials), so the controller
        can report on the executor's behalf when it did not."""
        ...

    async def delete(self, env: Environment) -> None:
        """Stop the executor if it still runs and remove the environment with everything it
        owns. Deleting what does not exist is success."""
        ...

    async def collect_orphans(self, launching: Collection[str]) -> list[str]:
        """Remove leftovers that belong to no environment (except assignment ids in
        `launching`); returns what was removed, for the log."""
        ...

    async def aclose(self) -> None: ...


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
