"""Evaluating a workflow value where it sits: the allowed contexts of that key, the job's
status for the status functions, and the type GitHub expects there.

Keys name the place in the workflow as GitHub's context-availability table does
(`jobs.<job_id>.steps.if`, ...); `ALLOWED_CONTEXTS` of the expression engine says which
contexts each key may use, so naming any other context there is an error, as on GitHub.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynrunner.executor.contexts import JobContexts
from dynrunner.executor.expressions import (
    ALLOWED_CONTEXTS,
    EvalEnv,
    ExpressionError,
    evaluate,
    evaluate_if,
    interpolate,
    interpolate_tree,
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

__all__ = ["Evaluator", "ExpressionError"]


def truthy(value: Any) -> bool:
    """GitHub's coercion to boolean: false, 0, -0, NaN, '' and null are false."""
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return not (value == 0 or (isinstance(value, float) and math.isnan(value)))
    if isinstance(value, str):
        return value != ""
    return True


def _single_expression(text: str) -> str | None:
    """The inside of `text` when it is exactly one `${{ ... }}`, else None."""
    stripped = text.strip()
    if stripped.startswith("${{") and stripped.endswith("}}") and stripped.count("${{") == 1:
        return stripped[3:-2]
    return None


class Evaluator:
    def __init__(self, contexts: JobContexts, workspace: Path) -> None:
        self.contexts = contexts
        self.workspace = workspace

    def env(
        self,
        where: str,
        *,
        env: Mapping[str, str] | None = None,
        github: Mapping[str, Any] | None = None,
        status: str | None = None,
    ) -> EvalEnv:
        return EvalEnv(
            self.contexts.values(env=env, github=github),
            ALLOWED_CONTEXTS[where],
            status or self.contexts.status,
            str(self.workspace),
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

    def tree(self, where: str, value: Any, **scope: Any) -> Any:
        if not _has_expression(value):
            return value
        return interpolate_tree(value, self.env(where, **scope))

    def strings(self, where: str, mapping: Mapping[str, Any], **scope: Any) -> dict[str, str]:
        """A mapping of string values (`env:`, `with:`), each interpolated in order."""
        return {key: self.text(where, value, **scope) for key, value in mapping.items()}

    def condition(self, where: str, condition: str, **scope: Any) -> bool:
        """An `if:` (empty means `success()`); raises ExpressionError."""
        return bool(evaluate_if(condition or "success()", self.env(where, **scope)))

    def flag(self, where: str, value: Any, **scope: Any) -> bool:
        """A boolean field such as `continue-on-error` (a literal or an expression)."""
        if isinstance(value, bool) or value is None:
            return bool(value)
        if not isinstance(value, str):
            return truthy(value)
        inner = _single_expression(value)
        if inner is not None:
            return truthy(evaluate(inner, self.env(where, **scope)))
        text = self.text(where, value, **scope).strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise ExpressionError(f"{where}: expected a boolean, got {text!r}")

    def minutes(self, where: str, value: Any, **scope: Any) -> float | None:
        """A `timeout-minutes` field; None when unset or 0 (no timeout, as GitHub's runner reads
        it). Raises ExpressionError for anything but a non-negative number."""
        if value is None or value == "":
            return None
        if isinstance(value, str):
            inner = _single_expression(value)
            result: Any = evaluate(inner, self.env(where, **scope)) if inner is not None else value
            if isinstance(result, str):
                try:
                    result = float(result)
                except ValueError:
                    raise ExpressionError(f"{where}: expected a number of minutes, got {result!r}") from None
            value = result
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or math.isnan(value):
            raise ExpressionError(f"{where}: expected a number of minutes, got {value!r}")
        return float(value) or None


def _has_expression(value: Any) -> bool:
    if isinstance(value, str):
        return "${{" in value
    if isinstance(value, dict):
        return any(_has_expression(k) or _has_expression(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_expression(v) for v in value)
    return False
