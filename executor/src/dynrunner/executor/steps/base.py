"""What a step handler gets (`StepRun`) and returns: the seam every step kind implements."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dynrunner.executor.runtime import JobRuntime, StepFiles
from dynrunner.executor.scope import Scope
from dynrunner.executor.steps.process import StopTimings
from dynrunner.executor.steps.processes import LOCAL, Processes
from dynrunner.executor.workflow import Step


class Stop(enum.Enum):
    CANCELLED = "cancelled"
    STEP_TIMEOUT = "step timeout"
    JOB_TIMEOUT = "job timeout"
    DEADLINE = "deadline"
    ABORTED = "aborted"

    @property
    def outcome(self) -> str:
        """The outcome of a step this stopped: cancelled, or failed by a timeout or the deadline."""
        return "cancelled" if self in (Stop.CANCELLED, Stop.ABORTED) else "failure"


class StopSignal:
    """A running step's stop request: the event its handler watches and why it was set."""

    __slots__ = ("event", "reason")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason: Stop | None = None

    def set(self, reason: Stop) -> None:
        if self.reason is None:
            self.reason = reason
        self.event.set()


class StepsRunner(Protocol):
    """The step engine as a handler sees it: what runs a composite action's steps."""

    async def run_steps(self, steps: tuple[Step, ...], scope: Scope, *, caller: StopSignal | None = None) -> None: ...


class ContainerImages(Protocol):
    """Runs a container action's image (podman in local and VM pools); absent in Pods."""

    async def run_image(
        self,
        run: StepRun,
        *,
        image: str,
        build_dir: Path | None,
        dockerfile: str,
        entrypoint: str,
        args: Sequence[str],
        env: Mapping[str, str],
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class StepRun:
    step: Step
    name: str
    """The evaluated display name."""
    env: Mapping[str, str]
    """The full process environment of the step ({} for a step that starts no process)."""
    env_context: Mapping[str, str]
    """The `env` context (workflow, job, GITHUB_ENV and step `env:`), for the header."""
    step_env: Mapping[str, str]
    """The step's own `env:` layer (with the `env:` of the step that called its action)."""
    with_: Mapping[str, str]
    working_directory: Path
    shell: str | None
    files: StepFiles | None
    """The step's own environment files, scripts and artifacts directory (None for a step
    that starts no process of its own, such as a composite action)."""
    runtime: JobRuntime
    interpolate: Callable[[str], str]
    """`${{ }}` in a string of this step, with the step's contexts; raises ExpressionError."""
    log: Callable[[str], None]
    output: Callable[[list[str]], None]
    stop: StopSignal
    timings: StopTimings
    backpressure: Callable[[], Awaitable[None]] | None = None
    processes: Processes = LOCAL
    """Where its processes run: here, or in the job container."""
    images: ContainerImages | None = None
    """What runs container actions, where the pool has a container engine."""
    """Awaited after each chunk of output: waits while the log backlog is too large."""
    engine: StepsRunner | None = None
    scope: Scope | None = None
    """Where the step runs; a composite action runs its own steps in a child of it."""
    stage: str = "main"
    """`pre`, `main` or `post` of the action."""
    state: Mapping[str, str] = field(default_factory=dict)
    """What the action's earlier stages saved (`GITHUB_STATE`): `STATE_*` of this stage."""
    outputs: dict[str, str] = field(default_factory=dict)
    """Outputs the handler sets itself (a composite action's, from its `action.yml`)."""


Handler = Callable[[StepRun], Coroutine[Any, Any, bool]]
