"""What a step handler gets (`StepRun`) and returns: the seam every step kind implements."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynrunner.executor.runtime import JobRuntime, StepFiles
from dynrunner.executor.steps.process import StopTimings
from dynrunner.executor.workflow import Step


@dataclass(frozen=True, slots=True)
class StepRun:
    step: Step
    name: str
    """The evaluated display name."""
    env: Mapping[str, str]
    """The full process environment of the step."""
    env_context: Mapping[str, str]
    """The `env` context (workflow, job, GITHUB_ENV and step `env:`), for the header."""
    with_: Mapping[str, str]
    working_directory: Path
    shell: str | None
    files: StepFiles
    runtime: JobRuntime
    interpolate: Callable[[str], str]
    """`${{ }}` in a string of this step, with the step's contexts; raises ExpressionError."""
    log: Callable[[str], None]
    output: Callable[[list[str]], None]
    stop: asyncio.Event
    timings: StopTimings
    backpressure: Callable[[], Awaitable[None]] | None = None
    """Awaited after each chunk of output: waits while the log backlog is too large."""


Handler = Callable[[StepRun], Coroutine[Any, Any, bool]]
