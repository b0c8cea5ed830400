"""Job outputs on their way to Gitea: checked against Gitea's limits, resent until stored.

Gitea ignores (only logs) an output whose key exceeds 255 bytes or whose value exceeds
1 MiB, and stores the first value it receives for a key. `sent_outputs` in each
UpdateTask answer lists every key it has stored so far, whichever request brought it
(`UpdateTask` in `routers/api/actions/runner/runner.go`, the same at v1.24.0, v1.25.0,
v1.26.0 and on main): so outputs can travel in several requests, each small enough for a
front end's body limit (`batch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_KEY_BYTES = 255
MAX_VALUE_BYTES = 1024 * 1024
ENTRY_OVERHEAD = 12
"""Wire bytes of one `outputs` map entry beyond its key and value (tags and lengths)."""


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
    key_size = _utf8_size(key)
    if key_size > MAX_KEY_BYTES:
        return OutputViolation(key, "key", key_size, MAX_KEY_BYTES)
    value_size = _utf8_size(value)
    if value_size > MAX_VALUE_BYTES:
        return OutputViolation(key, "value", value_size, MAX_VALUE_BYTES)
    return None


class Outputs:
    def __init__(self) -> None:
        self._pending: dict[str, str] = {}
        self._sizes: dict[str, int] = {}  # wire bytes of each pending entry
        self._stored: set[str] = set()
        self.per_request: int | None = None
        """At most this many outputs in one request (after a front end refused a batch)."""

    @property
    def pending(self) -> dict[str, str]:
        """Outputs Gitea has not confirmed yet."""
        return dict(self._pending)

    def batch(self, budget: int) -> dict[str, str]:
        """Pending outputs for the next UpdateTask: in order, as many as fit in `budget`
        bytes of request body (and `per_request`); at least one, however big."""
        out: dict[str, str] = {}
        used = 0
        for key, value in self._pending.items():
            size = self._sizes[key]
            if out and (used + size > budget or (self.per_request is not None and len(out) >= self.per_request)):
                break
            out[key] = value
            used += size
        return out

    def size(self, key: str) -> int:
        return self._sizes[key]

    def drop(self, key: str) -> None:
        """Give up on `key`: it can never be sent."""
        self._pending.pop(key, None)
        self._sizes.pop(key, None)

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
                self._sizes[key] = _utf8_size(key) + _utf8_size(value) + ENTRY_OVERHEAD
                queued = True
        if violations:
            raise OutputLimitError(violations)
        return queued

    def confirmed(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._stored.add(key)
            self.drop(key)


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
