"""GitHub Actions expressions (`${{ }}`), evaluated exactly as GitHub's runner does.

The job engine calls `evaluate`, `interpolate`, `interpolate_tree` and `evaluate_if` with
an `EvalEnv` that holds the contexts and the names allowed where the expression sits
(`ALLOWED_CONTEXTS`). Every failure is an `ExpressionError` with GitHub's wording.
The language and its deviations are described in docs/expressions.md.
"""

from dynrunner.executor.expressions.availability import ALLOWED_CONTEXTS
from dynrunner.executor.expressions.errors import ExpressionError
from dynrunner.executor.expressions.evaluator import EvalEnv, evaluate
from dynrunner.executor.expressions.templates import evaluate_if, interpolate, interpolate_tree, is_single_expression
from dynrunner.executor.expressions.values import is_truthy, to_display_string

__all__ = [
    "ALLOWED_CONTEXTS",
    "EvalEnv",
    "ExpressionError",
    "evaluate",
    "evaluate_if",
    "interpolate",
    "interpolate_tree",
    "is_single_expression",
    "is_truthy",
    "to_display_string",
]
