"""Fault injection for tests: latency, error answers, dropped and expired watches."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from dynrunner.doubles.kubernetes.status import ApiError

_REASONS = {
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: injected fault"),
    503: ("ServiceUnavailable", "The server is currently unable to handle the request"),
    504: (
        "Timeout",
        "The server was unable to return a response in the time allotted, but may still be processing the request",
    ),
}


@dataclass
class _Rule:
    code: int
    remaining: int
    method: str | None
    path: str | None


class Faults:
    """Thread-safe: tests set faults from their own thread while the server runs."""

    def __init__(self) -> None:
        self.latency = 0.0
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()

    def fail(self, count: int = 1, code: int = 500, method: str | None = None, path: str | None = None) -> None:
        """Answer the next `count` matching requests (method, and a substring of the path) with `code`."""
        with self._lock:
            self._rules.append(_Rule(code, count, method.upper() if method else None, path))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self.latency = 0.0

    def pick(self, method: str, path: str) -> ApiError | None:
        with self._lock:
            for rule in self._rules:
                if rule.remaining > 0 and (rule.method in (None, method)) and (rule.path is None or rule.path in path):
                    rule.remaining -= 1
                    reason, message = _REASONS.get(rule.code, ("InternalError", "injected fault"))
                    details = {"retryAfterSeconds": 1} if rule.code == 429 else None
                    return ApiError(rule.code, reason, message, details)
        return None
