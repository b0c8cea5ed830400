"""Job outputs on their way to Gitea: checked against Gitea's limits, resent until stored.

Gitea ignores (only logs) an output whose key exceeds 255 bytes or whose value exceeds
1 MiB, and stores the first value it receives for a key. `sent_outputs` in each
UpdateTask answer lists every key it has stored so far.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_KEY_BYTES = 255
MAX_VALUE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class OutputViolation:
    key: str
    limit: str  # "key" or "value"
    size: int
    maximum: int

    def __str__(self) -> str:
        what = "name" if self.limit == "key" else "value"
        shown = self.key if len(self.key) <= 64 else self.key[:61] + "..."
        return f"output {shown!r}: {what} is {self.size} bytes, the limit is {self.maximum} bytes"


class OutputLimitError(ValueError):
    """Some outputs break Gitea's limits and were not sent; the others were accepted."""

    def __init__(self, violations: Iterable[OutputViolation]) -> None:
        self.violations = tuple(violations)
        super().__init__("; ".join(str(v) for v in self.violations))


def check(key: str, value: str) -> OutputViolation | None:
    key_size = len(key.encode("utf-8", "surrogatepass"))
    if key_size > MAX_KEY_BYTES:
        return OutputViolation(key, "key", key_size, MAX_KEY_BYTES)
    value_size = len(value.encode("utf-8", "surrogatepass"))
    if value_size > MAX_VALUE_BYTES:
        return OutputViolation(key, "value", value_size, MAX_VALUE_BYTES)
    return None


class Outputs:
    def __init__(self) -> None:
        self._pending: dict[str, str] = {}
        self._stored: set[str] = set()

    @property
    def pending(self) -> dict[str, str]:
        """Outputs Gitea has not confirmed yet (sent with every UpdateTask)."""
        return dict(self._pending)

    @property
    def stored(self) -> frozenset[str]:
        return frozenset(self._stored)

    def set(self, outputs: Mapping[str, str]) -> bool:
        """Queue `outputs`; returns whether anything new is queued. Raises OutputLimitError
        naming every output that breaks a limit, after queueing the valid ones."""
        violations = []
        queued = False
        for key, value in outputs.items():
            problem = check(key, value)
            if problem is not None:
                violations.append(problem)
            elif key not in self._stored and self._pending.get(key) != value:
                self._pending[key] = value
                queued = True
        if violations:
            raise OutputLimitError(violations)
        return queued

    def confirmed(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._stored.add(key)
            self._pending.pop(key, None)
