"""`evaluate()`: one expression against the contexts the caller provides.

The caller says which contexts exist where the expression sits (`EvalEnv.allowed`, see
`ALLOWED_CONTEXTS`); naming any other is the parse error GitHub gives ("Unrecognized
named-value: 'steps'. ..."). The special functions (`hashFiles`, status functions) are
recognized only where `allowed` lists them too; with `allowed=None` every context present
and every function is allowed. Context names and object keys ignore case, except the
keys of `env`, which are case-sensitive as on a Linux runner.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from dynrunner.proto.expressions.errors import ExpressionError
from dynrunner.proto.expressions.evaluation import DEFAULT_MAX_MEMORY, Evaluation, HashFiles
from dynrunner.proto.expressions.functions import BUILTIN_FUNCTIONS, SPECIAL_FUNCTIONS, STATUS_FUNCTIONS
from dynrunner.proto.expressions.nodes import FunctionInfo, Node
from dynrunner.proto.expressions.parser import parse

JOB_STATUSES = ("success", "failure", "cancelled")


@dataclass
class EvalEnv:
    """Where an expression is evaluated: contexts (plain JSON-like values) and caller answers."""

    contexts: Mapping[str, Any] = field(default_factory=dict)
    allowed: Collection[str] | None = None  # context and special-function names; None = all present
    job_status: str = "success"  # answers success()/failure()/cancelled()
    hash_files: HashFiles | None = None  # answers hashFiles(); None: the workspace is not known here
    max_memory: int = DEFAULT_MAX_MEMORY
    case_sensitive_contexts: Collection[str] = ("env",)


@lru_cache(maxsize=2048)
def _parse_cached(expression: str, names: frozenset[str], functions: frozenset[str]) -> Node | None:
    table: dict[str, FunctionInfo] = dict(BUILTIN_FUNCTIONS)
    table.update({name: SPECIAL_FUNCTIONS[name] for name in functions})
    return parse(expression, names, table)


class Scope:
    """An `EvalEnv` resolved once for any number of expressions (names, functions, values)."""

    def __init__(self, env: EvalEnv, *, status_functions: bool = False) -> None:
        if env.job_status not in JOB_STATUSES:
            raise ExpressionError(f"Unknown job status '{env.job_status}', expected one of {', '.join(JOB_STATUSES)}")
        self.env = env
        values: dict[str, Any] = {}
        for name, value in env.contexts.items():
            if name.lower() not in values or name == name.lower():
                values[name.lower()] = value
        self.values = values
        if env.allowed is None:
            self.names = frozenset(values)
            functions = set(SPECIAL_FUNCTIONS)
        else:
            allowed = {name.lower() for name in env.allowed}
            self.names = frozenset(allowed - set(SPECIAL_FUNCTIONS))
            functions = allowed & set(SPECIAL_FUNCTIONS)
        if status_functions:
            functions |= set(STATUS_FUNCTIONS)
        self.functions = frozenset(functions)
        sensitive = {name.lower() for name in env.case_sensitive_contexts}
        self.case_sensitive_ids = frozenset(
            id(v) for k, v in values.items() if k in sensitive and isinstance(v, Mapping)
        )

    def parse(self, expression: str) -> Node | None:
        if not isinstance(expression, str):
            raise ExpressionError(f"An expression must be a string, not {type(expression).__name__}")
        return _parse_cached(expression, self.names, self.functions)

    def run(self, node: Node | None) -> Any:
        if node is None:
            return None
        evaluation = Evaluation(
            node,
            self.values,
            case_sensitive_ids=self.case_sensitive_ids,
            job_status=self.env.job_status,
            hash_files=self.env.hash_files,
            max_memory=self.env.max_memory,
        )
        try:
            return node.evaluate(evaluation, 0)
        except RecursionError:
            raise ExpressionError("The expression's values are nested too deeply to evaluate") from None

    def evaluate(self, expression: str) -> Any:
        return self.run(self.parse(expression))


def evaluate(expression: str, env: EvalEnv) -> Any:
    """The value of `expression` (no `${{ }}`), as JSON-like Python; raises ExpressionError."""
    return Scope(env).evaluate(expression)
