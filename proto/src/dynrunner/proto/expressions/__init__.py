"""GitHub Actions expressions (`${{ }}`), evaluated exactly as GitHub's runner does.

The executor's job engine and the controller (a Pod job's `container:` and `services:`
values) call `evaluate`, `interpolate`, `interpolate_tree` and `evaluate_if` with an
`EvalEnv` that holds the contexts and the names allowed where the expression sits
(`ALLOWED_CONTEXTS`). Every failure is an `ExpressionError` with GitHub's wording.
`hashFiles()` is answered by the caller (`EvalEnv.hash_files`): only the executor has a
workspace. The language and its deviations are described in docs/expressions.md.
"""

from dynrunner.proto.expressions.availability import ALLOWED_CONTEXTS
from dynrunner.proto.expressions.errors import ExpressionError
from dynrunner.proto.expressions.evaluation import HashFiles
from dynrunner.proto.expressions.evaluator import EvalEnv, evaluate
from dynrunner.proto.expressions.templates import (
    evaluate_if,
    interpolate,
    interpolate_tree,
    is_single_expression,
    named_values,
)
from dynrunner.proto.expressions.values import is_truthy, to_display_string

__all__ = [
    "ALLOWED_CONTEXTS",
    "EvalEnv",
    "ExpressionError",
    "HashFiles",
    "evaluate",
    "evaluate_if",
    "interpolate",
    "interpolate_tree",
    "is_single_expression",
    "is_truthy",
    "named_values",
    "to_display_string",
]
