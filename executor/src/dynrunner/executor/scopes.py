"""Evaluating a workflow value where it sits: the allowed contexts of that key, the job's
status for the status functions, and the type GitHub expects there.

Keys name the place in the workflow as GitHub's context-availability table does
(`jobs.<job_id>.steps.if`, ...); `ALLOWED_CONTEXTS` of the expression engine says which
contexts each key may use, so naming any other context there is an error, as on GitHub.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynrunner.executor.expressions import (
    ALLOWED_CONTEXTS,
    EvalEnv,
    ExpressionError,
    evaluate_if,
    interpolate,
    interpolate_tree,
    is_single_expression,
    is_truthy,
    to_display_string,
)

WORKFLOW_ENV = "env"
JOB_NAME = "jobs.<job_id>.name"
JOB_IF = "jobs.<job_id>.if"
JOB_ENV = "jobs.<job_id>.env"
JOB_DEFAULTS_RUN = "jobs.<job_id>.defaults.run"
JOB_TIMEOUT = "jobs.<job_id>.timeout-minutes"
JOB_CONTINUE = "jobs.<job_id>.continue-on-error"
JOB_OUTPUTS = "jobs.<job_id>.outputs.<output_id>"
STEP_IF = "jobs.<job_id>.steps.if"
STEP_ENV = "jobs.<job_id>.steps.env"
STEP_NAME = "jobs.<job_id>.steps.name"
STEP_RUN = "jobs.<job_id>.steps.run"
STEP_WITH = "jobs.<job_id>.steps.with"
STEP_WORKING_DIRECTORY = "jobs.<job_id>.steps.working-directory"
STEP_TIMEOUT = "jobs.<job_id>.steps.timeout-minutes"
STEP_CONTINUE = "jobs.<job_id>.steps.continue-on-error"


@dataclass(frozen=True, slots=True)
class StepKeys:
    """The keys of a step's fields at one level: a workflow's steps, or an action's."""

    if_: str
    env: str
    name: str
    run: str
    with_: str
    working_directory: str
    timeout: str
    continue_on_error: str


ACTION_INPUT_DEFAULT = "inputs.<input_id>.default"
ACTION_OUTPUT = "outputs.<output_id>.value"
ACTION_PRE_IF = "runs.pre-if"
ACTION_POST_IF = "runs.post-if"
_ACTION_STEPS = "runs.steps"

WORKFLOW_STEP = StepKeys(
    if_=STEP_IF,
    env=STEP_ENV,
    name=STEP_NAME,
    run=STEP_RUN,
    with_=STEP_WITH,
    working_directory=STEP_WORKING_DIRECTORY,
    timeout=STEP_TIMEOUT,
    continue_on_error=STEP_CONTINUE,
)
ACTION_STEP = StepKeys(
    if_="runs.steps.if",
    env=_ACTION_STEPS,
    name=_ACTION_STEPS,
    run=_ACTION_STEPS,
    with_=_ACTION_STEPS,
    working_directory=_ACTION_STEPS,
    timeout=_ACTION_STEPS,
    continue_on_error=_ACTION_STEPS,
)

if TYPE_CHECKING:
    from dynrunner.executor.scope import Scope

__all__ = ["Evaluator", "ExpressionError"]


class Evaluator:
    """Evaluates values of one scope (the job's, or a composite action's)."""

    __slots__ = ("scope", "workspace")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.workspace = str(scope.workspace)

    def env(
        self,
        where: str,
        *,
        env: Mapping[str, str] | None = None,
        github: Mapping[str, Any] | None = None,
        status: str | None = None,
    ) -> EvalEnv:
        return EvalEnv(
            self.scope.values(env=env, github=github),
            ALLOWED_CONTEXTS[where],
            status or self.scope.status(),
            self.workspace,
        )

    def text(self, where: str, value: Any, **scope: Any) -> str:
        """A string field: `${{ }}` interpolated; YAML scalars as their text."""
        if value is None:
            return ""
        if not isinstance(value, str):
            return to_display_string(value)
        if "${{" not in value:
            return value
        return interpolate(value, self.env(where, **scope))

    def typed(self, where: str, value: Any, **scope: Any) -> Any:
        """A key whose value is not a string (`continue-on-error`, `timeout-minutes`, ...): a
        whole-value `${{ }}` keeps the expression's type, text mixed with expressions is a
        string, and YAML values stay as written."""
        if isinstance(value, str) and "${{" not in value:
            return value
        return interpolate_tree(value, self.env(where, **scope), keep_types=True)

    def strings(self, where: str, mapping: Mapping[str, Any], **scope: Any) -> dict[str, str]:
        """A mapping of string values (`env:`, `with:`), each interpolated in order."""
        return {key: self.text(where, value, **scope) for key, value in mapping.items()}

    def condition(self, where: str, condition: str, **scope: Any) -> bool:
        """An `if:` (empty means `success()`); raises ExpressionError."""
        return bool(evaluate_if(condition or "success()", self.env(where, **scope)))

    def flag(self, where: str, value: Any, **scope: Any) -> bool:
        """A boolean field such as `continue-on-error`: a whole-value expression counts by
        GitHub's truthiness; literal or mixed text must read `true` or `false`."""
        if isinstance(value, bool) or value is None:
            return bool(value)
        result = self.typed(where, value, **scope)
        if not isinstance(result, str) or is_single_expression(value):
            return is_truthy(result)
        text = result.strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise ExpressionError(f"{where}: expected a boolean, got {text!r}")

    def minutes(self, where: str, value: Any, **scope: Any) -> float | None:
        """A `timeout-minutes` field; None when unset or 0 (no timeout, as GitHub's runner
        reads it). Fractions are honoured: GitHub documents none (its converter truncates,
        act ignores them), and a sub-minute timeout is what short steps and quick tests ask
        for — truncating `0.5` to "no timeout at all" would turn a bound into none. Raises
        ExpressionError for anything but a non-negative number."""
        if value is None or value == "":
            return None
        result = self.typed(where, value, **scope)
        if isinstance(result, str):
            try:
                result = float(result)
            except ValueError:
                raise ExpressionError(f"{where}: expected a number of minutes, got {result!r}") from None
        if isinstance(result, bool) or not isinstance(result, (int, float)) or result < 0 or math.isnan(result):
            raise ExpressionError(f"{where}: expected a number of minutes, got {result!r}")
        return float(result) or None
