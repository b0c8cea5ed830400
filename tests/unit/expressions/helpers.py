"""Shared shorthand for the expression tests."""

from __future__ import annotations

from typing import Any

from dynrunner.executor.expressions import EvalEnv, evaluate


def ev(expression: str, **contexts: Any) -> Any:
    """Evaluate with the given contexts, every one of them allowed."""
    return evaluate(expression, EvalEnv(contexts=contexts))
