"""The one error type of the expression language.

GitHub's evaluator raises parse errors (with the offending token and its position) and
evaluation errors (bad format string, bad JSON, memory limit, ...). Callers only need to
know that the expression is at fault and show the message, so both are one type here;
`kind` tells them apart for tests and tooling.
"""

from __future__ import annotations


class ExpressionError(Exception):
    """An expression could not be parsed or evaluated; `str(error)` is the user-facing message."""

    def __init__(self, message: str, *, kind: str = "evaluation", position: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.position = position

    def __str__(self) -> str:
        return self.message
