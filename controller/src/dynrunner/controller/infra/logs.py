"""Structured logging: one JSON object per line, carrying the ids of the work in hand.

`log_context(assignment_id=..., task_id=..., pool=...)` binds ids in a context variable, so
every record emitted inside — including from tasks started inside, which copy the context —
carries them without threading them through every call.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging", "current_context", "log_context"]

_context: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("dynrunner_log_context", default={})  # noqa: B039

# Attributes every LogRecord has; anything else was passed with `extra=` and is emitted as a field.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


@contextlib.contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Add `ids` (None values are skipped) to every record logged inside this block."""
    merged = {**_context.get(), **{k: v for k, v in ids.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, Any]:
    return dict(_context.get())


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = dict(_context.get())
    fields.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")})
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """For a terminal: the usual line, with the context ids appended as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if fields:
            first, nl, rest = line.partition("\n")
            line = first + " " + " ".join(f"{k}={v}" for k, v in fields.items()) + nl + rest
        return line


def configure_logging(level: str | int = "info", json: bool = True, stream: TextIO | None = None) -> logging.Handler:
    """Route every `dynrunner` (and library) record to `stream` (stderr), replacing earlier handlers
    installed by this function. Returns the handler (tests remove it again)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    handler.set_name("dynrunner")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "dynrunner"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
