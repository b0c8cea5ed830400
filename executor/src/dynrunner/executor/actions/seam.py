"""What the action stages need of the step engine, and the prepared step they share with it.

`engine.StepEngine` implements `Engine`; the stages (`stages`) get it as this narrow view, so
the actions package never imports the engine that runs it. `Prepared` and `Limits` are what
the engine hands the stages for a `uses:` step, and what they hand back to run a stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dynrunner.executor.actions import ActionCall
from dynrunner.executor.reporter import Reporter
from dynrunner.executor.runtime import StepFiles
from dynrunner.executor.runtime.ahead import StepFilesPool
from dynrunner.executor.scope import Evaluator, Scope
from dynrunner.executor.steps.base import Handler, StopSignal
from dynrunner.executor.supervise import JobSignals
from dynrunner.executor.workflow import Step
from dynrunner.proto.expressions import ExpressionError


@dataclass(frozen=True, slots=True)
class Prepared:
    """A step evaluated up to its handler: what its stages (main, post) run with."""

    step: Step
    scope: Scope
    ev: Evaluator
    row: int | None
    log: Callable[[str], None]
    name: str
    env_context: dict[str, str]
    step_env: dict[str, str]
    with_: dict[str, str]
    workdir: Path
    shell: str | None
    where: dict[str, object]
    action: ActionCall | None = None

    def holds(self, key: str, condition: str, *, status: str | None = None) -> bool:
        """Whether `condition` holds now (an error is logged and counts as false)."""
        try:
            return self.ev.condition(key, condition, status=status, **self.where)
        except ExpressionError as err:
            self.log(f"##[error]{err}")
            return False


@dataclass(frozen=True, slots=True)
class Limits:
    """A step's `timeout-minutes` and when, on the loop's clock, it runs out."""

    minutes: float | None = None
    deadline: float | None = None


class Engine(Protocol):
    """The step engine as the action stages use it."""

    reporter: Reporter
    signals: JobSignals
    files: StepFilesPool

    def prepare_for_setup(self, step: Step, scope: Scope) -> Prepared | None:
        """A job's step evaluated as the job starts (None when it cannot be)."""
        ...

    async def execute(
        self,
        p: Prepared,
        handler: Handler,
        files: StepFiles | None,
        *,
        limits: Limits,
        still_wanted: Callable[[], bool],
        caller: StopSignal | None,
        stage: str = "main",
        state: Mapping[str, str] | None = None,
    ) -> tuple[str, dict[str, str], dict[str, str]]:
        """Run `handler` for one stage of a prepared step under supervision: (outcome, outputs, state)."""
        ...
