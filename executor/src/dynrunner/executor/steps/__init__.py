"""Step kinds behind one seam: a step's form picks a handler from `HANDLERS`.

A handler gets a `StepRun` (everything the job loop already evaluated for the step) and
returns whether the step succeeded. It logs its own header and errors through `run.log`;
output of processes it starts goes through `run.output`, which applies workflow commands.
When `run.stop` is set (cancellation, a timeout, the deadline) a handler stops promptly;
the job loop knows why and decides the step's outcome.

Forms: `run` (a script), `dynrunner://artifact-import` (native, the runtime library) and
`uses` (any other action: `actions.stages` runs it, by its kind).
"""

from __future__ import annotations

from dynrunner.executor.steps.base import Handler, StepRun
from dynrunner.executor.steps.native import ARTIFACT_IMPORT, artifact_import
from dynrunner.executor.steps.run_step import run_script
from dynrunner.executor.workflow import Step

HANDLERS: dict[str, Handler] = {
    "run": run_script,
    ARTIFACT_IMPORT: artifact_import,
}


def form_of(step: Step) -> str:
    if step.run is not None:
        return "run"
    if step.uses in HANDLERS:
        return str(step.uses)
    return "uses"


def handler_for(step: Step) -> Handler:
    return HANDLERS[form_of(step)]


__all__ = ["ARTIFACT_IMPORT", "HANDLERS", "Handler", "StepRun", "form_of", "handler_for"]
