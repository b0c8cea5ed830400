"""Readable configuration errors: one line per problem, `key.path[i].key: what is wrong`.

pydantic's own messages name Python types and echo input values; operators read YAML keys,
and a value may be a secret, so errors are rewritten here and values are echoed only for
short scalars under keys that cannot hold secrets.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

BACKEND_KINDS = ("local", "kubernetes", "opensandbox")
_SECRET_HINTS = ("token", "password", "secret", "key", "url", "credential")


class ConfigError(ValueError):
    """The configuration is invalid; `problems` holds one line per problem."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid configuration ({source}):\n{lines}")


def key_path(loc: Iterable[int | str]) -> str:
    out = ""
    previous: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif previous == "backend" and part in BACKEND_KINDS:
            continue  # the tag pydantic adds for the discriminated union
        else:
            out += f".{part}" if out else part
        previous = part
    return out or "(top level)"


def _known_keys(model: type[BaseModel], into: set[str]) -> set[str]:
    for name, info in model.model_fields.items():
        into.add(info.alias or name)
        for arg in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel) and arg is not model:
                _known_keys(arg, into)
    return into


def _message(err: ErrorDetails, known: set[str]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    loc = err["loc"]
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else ""
        close = difflib.get_close_matches(name, sorted(known), n=1)
        return "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        symbol = {"greater_than_equal": "≥", "greater_than": ">", "less_than_equal": "≤", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        return f"must be {symbol} {bound:g}" if isinstance(bound, float) else f"must be {symbol} {bound}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}"
    if kind == "union_tag_invalid":
        return f"kind {ctx.get('tag')!r} is not a known backend (known: {ctx.get('expected_tags')})"
    if kind == "union_tag_not_found":
        return f"needs `kind` (one of {', '.join(BACKEND_KINDS)})"
    simple = {
        "int_parsing": "must be an integer",
        "int_type": "must be an integer",
        "int_from_float": "must be a whole number",
        "float_parsing": "must be a number",
        "float_type": "must be a number",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "model_type": "must be a mapping of keys",
        "model_attributes_type": "must be a mapping of keys",
        "dict_type": "must be a mapping of keys",
        "path_type": "must be a path",
    }
    if kind in simple:
        return simple[kind]
    msg = err["msg"]
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def _echo(err: ErrorDetails, path: str) -> str:
    value: Any = err.get("input")
    if err["type"] in ("missing", "extra_forbidden", "value_error", "assertion_error"):
        return ""
    if any(hint in path.lower() for hint in _SECRET_HINTS):
        return ""
    if isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= 80):
        return f" (got {value!r})"
    return ""


def format_validation_error(err: ValidationError, data: object, model: type[BaseModel]) -> list[str]:
    known = _known_keys(model, set())
    problems = []
    for detail in err.errors(include_url=False):
        path = key_path(detail["loc"])
        problems.append(f"{path}: {_message(detail, known)}{_echo(detail, path)}")
    return problems
