"""Composite actions: the action's steps, run in a scope of their own.

The steps see the action's `inputs`, their own `steps` context and status (`success()`
and `failure()` look at the action's steps; `cancelled()` at the job), `github.action_path`
and no `secrets`; each has its own `if`, `env`, `shell`, `working-directory`,
`continue-on-error` and may use other actions, up to ten levels deep (GitHub's limit).
Their rows go into the range of the job's step that called the action. The action fails
when one of its steps' conclusion is failure, and is cancelled when one was cancelled; its
`outputs:` are evaluated afterwards, from its steps' outputs, whatever its result.
"""

from __future__ import annotations

from dynrunner.executor.actions import ActionCall
from dynrunner.executor.actions.node import header
from dynrunner.executor.scope import ACTION_OUTPUT, ACTION_STEP, MAX_DEPTH, Evaluator
from dynrunner.executor.steps.base import StepRun, Stop
from dynrunner.proto.expressions import ExpressionError


async def run_composite(run: StepRun, call: ActionCall) -> bool:
    scope, engine = run.scope, run.engine
    assert call.manifest is not None and scope is not None and engine is not None
    run.log("\n".join(header(f"Run {call.display}", call.inputs, run)) + "\n")
    if scope.depth + 1 > MAX_DEPTH:
        run.log(
            f"##[error]The action {call.display} would nest composite actions more than {MAX_DEPTH} levels deep, "
            "the most a runner allows."
        )
        return False
    github = dict(scope.github)
    github.update(
        action_path=str(call.directory), action_repository=call.repository, action_ref=call.ref, action_status=""
    )
    child = scope.child(
        keys=ACTION_STEP,
        github=github,
        inputs=call.inputs,
        env=run.step_env,
        action=call.info(),
        rows=scope.row_index(run.step),
    )
    await engine.run_steps(call.manifest.steps, child, caller=run.stop)
    ev = Evaluator(child)
    for name, value in call.manifest.outputs.items():
        try:
            run.outputs[name] = ev.text(ACTION_OUTPUT, value)
        except ExpressionError as err:
            run.log(f"##[error]The output '{name}' of the action {call.display} could not be evaluated: {err}")
            child.failed = True
    if child.cancelled:
        run.stop.set(Stop.CANCELLED)  # a cancelled step cancels the action (GitHub's rule)
    return not child.failed and not child.cancelled and run.stop.reason is None
