"""State of one evaluation: context values, caller answers, and GitHub's memory budget.

The runner bounds the memory an evaluation may hold (10 MiB for workflow templates) and
fails with "The maximum allowed memory size was exceeded ..." past it. It counts bytes per
tree level (`EvaluationMemory`): a node's result is added at its level, and a primitive
result computed by the node releases what its children held. Strings cost 26 + 2 bytes per
UTF-16 unit, anything else 24. Functions that build large results count as they go
(`MemoryCounter`), so a huge `format`/`join`/`toJSON` fails before it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dynrunner.proto.expressions.errors import ExpressionError
from dynrunner.proto.expressions.values import is_primitive, utf16_len

DEFAULT_MAX_MEMORY = 10 * 1024 * 1024
MIN_OBJECT_SIZE = 24
STRING_BASE_OVERHEAD = 26
POINTER_SIZE = 8

HashFiles = Callable[[list[str]], str]
"""The caller's answer to `hashFiles(args...)` (the executor hashes its workspace; see
`dynrunner.executor.hashfiles`). The language only parses and counts the call."""


class Expression(Protocol):
    """What an evaluation needs of a tree node (`nodes.Node`): its text, for the error."""

    def to_expression(self) -> str: ...


def string_bytes(s: str) -> int:
    return STRING_BASE_OVERHEAD + 2 * utf16_len(s)


def value_bytes(value: Any) -> int:
    return string_bytes(value) if isinstance(value, str) else MIN_OBJECT_SIZE


def memory_exceeded(node: Expression | None) -> ExpressionError:
    expression = node.to_expression() if node is not None else ""
    return ExpressionError(
        f"The maximum allowed memory size was exceeded while evaluating the following expression: {expression}"
    )


class MemoryCounter:
    """Bytes of one result under construction, bounded like the runner's counter."""

    def __init__(self, node: Expression, max_bytes: int) -> None:
        self._node = node
        self._max = max_bytes
        self.bytes = 0

    def add(self, amount: int) -> None:
        total = self.bytes + amount
        if total > self._max:
            raise memory_exceeded(self._node)
        self.bytes = total

    def add_string(self, s: str) -> None:
        self.add(string_bytes(s))


class Evaluation:
    """Everything a node needs while evaluating: named values, caller answers, memory."""

    def __init__(
        self,
        root: Expression,
        values: Mapping[str, Any],
        *,
        case_sensitive_ids: frozenset[int] = frozenset(),
        job_status: str = "success",
        hash_files: HashFiles | None = None,
        max_memory: int = DEFAULT_MAX_MEMORY,
    ) -> None:
        self.root = root
        self.values = values
        self.case_sensitive_ids = case_sensitive_ids
        self.job_status = job_status
        self.hash_files = hash_files
        self.max_memory = max_memory
        self._depths: list[int] = []
        self._max_active_depth = -1
        self._total = 0

    def counter(self, node: Expression) -> MemoryCounter:
        return MemoryCounter(node, self.max_memory)

    def is_case_sensitive(self, obj: object) -> bool:
        return id(obj) in self.case_sensitive_ids

    def account(self, level: int, value: Any, result_bytes: int | None, from_data: bool) -> None:
        """Record a node's result at its tree level (the runner's `ExpressionNode.Evaluate`)."""
        primitive = is_primitive(value)
        raw = from_data and primitive and value is not None
        trim = primitive and not raw
        if result_bytes is None:
            result_bytes = MIN_OBJECT_SIZE if raw else value_bytes(value)
        self._add(level, result_bytes, trim)
        if raw:
            self._add(level, value_bytes(value), False)

    def _add(self, depth: int, amount: int, trim: bool) -> None:
        if trim:
            while self._max_active_depth > depth:
                self._total -= self._depths[self._max_active_depth]
                self._depths[self._max_active_depth] = 0
                self._max_active_depth -= 1
        if depth > self._max_active_depth:
            while len(self._depths) <= depth:
                self._depths.append(0)
            self._max_active_depth = depth
        self._depths[depth] += amount
        self._total += amount
        if self._total > self.max_memory:
            raise memory_exceeded(self.root)
