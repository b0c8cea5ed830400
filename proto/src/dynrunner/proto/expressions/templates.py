"""`${{ }}` in workflow values and `if:` conditions, as GitHub's template reader treats them.

A value that is exactly one `${{ expr }}` evaluates to the expression's value; a value
mixing text and expressions becomes `format('text {0} text', expr)`, so each expression is
converted with GitHub's string rules (objects → 'Object', arrays → 'Array'). The end of an
expression is the first `}}` outside a single-quoted string. Where a string is required,
a whole-value expression giving an object or array is GitHub's "A mapping was not
expected" / "A sequence was not expected" error.

`if:` is an expression with or without `${{ }}`; unless it calls a status function it
means `success() && (<condition>)`; an empty condition means `success()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynrunner.proto.expressions.errors import ExpressionError
from dynrunner.proto.expressions.evaluator import EvalEnv, Scope
from dynrunner.proto.expressions.functions import STATUS_FUNCTIONS
from dynrunner.proto.expressions.nodes import Call, NamedValue, Node, walk
from dynrunner.proto.expressions.values import (
    dotnet_strip,
    format_number,
    is_array,
    is_object,
    is_truthy,
    to_display_string,
)

OPEN, CLOSE = "${{", "}}"
NOT_CLOSED = (
    "The expression is not closed. An unescaped ${{ sequence was found, but the closing }} sequence was not found."
)


@dataclass(frozen=True)
class Expr:
    """An expression segment of a template string (the text between `${{` and `}}`, trimmed)."""

    text: str


def split_template(raw: str) -> list[str | Expr]:
    """Literal text and expression segments, in order (the runner's `ParseScalar`)."""
    start = raw.find(OPEN)
    if start < 0:
        return [raw]
    segments: list[str | Expr] = []
    i = 0
    while i < len(raw):
        if i == start:
            end = -1
            in_string = False
            j = i + len(OPEN)
            while j < len(raw):
                c = raw[j]
                if c == "'":
                    in_string = not in_string  # '' inside a string toggles twice
                elif not in_string and c == "}" and raw[j - 1] == "}":
                    end = j
                    j += 1
                    break
                j += 1
            if end < start:
                raise ExpressionError(NOT_CLOSED, kind="parse")
            text = dotnet_strip(raw[start + len(OPEN) : end - 1])
            if not text:
                raise ExpressionError("An expression was expected", kind="parse")
            segments.append(Expr(text))
            i = j
            start = raw.find(OPEN, i)
        elif start >= 0:
            segments.append(raw[i:start])
            i = start
        else:
            segments.append(raw[i:])
            break
    return segments


def _sole(segments: list[str | Expr]) -> Expr | None:
    """The expression when the segments are exactly one expression."""
    return segments[0] if len(segments) == 1 and isinstance(segments[0], Expr) else None


def is_single_expression(text: str) -> bool:
    """Whether `text` is exactly one `${{ expr }}` (nothing around it), the form whose value
    keeps its type where a workflow key is not a string. Raises ExpressionError for an
    unclosed or empty `${{`."""
    return OPEN in text and _sole(split_template(text)) is not None


def _string_literal(text: str) -> str | None:
    """The value of an expression that is only a string literal (`'it''s'`), else None."""
    out: list[str] = []
    in_string = False
    for i, c in enumerate(text):
        if c == "'":
            in_string = not in_string
            if in_string and i != 0:
                out.append(c)
        elif not in_string:
            return None
        else:
            out.append(c)
    return "".join(out)


def _as_template_string(value: Any) -> str:
    if is_object(value):
        raise ExpressionError("A mapping was not expected")
    if is_array(value):
        raise ExpressionError("A sequence was not expected")
    return to_display_string(value)


class _Template:
    def __init__(self, scope: Scope, raw: str) -> None:
        self.segments = split_template(raw)
        self.nodes: list[Node | None] = [scope.parse(s.text) if isinstance(s, Expr) else None for s in self.segments]
        self.scope = scope

    @property
    def has_expressions(self) -> bool:
        return any(isinstance(s, Expr) for s in self.segments)

    @property
    def whole_value(self) -> bool:
        return _sole(self.segments) is not None

    def value(self) -> Any:
        return self.scope.run(self.nodes[0])

    def string(self) -> str:
        if self.whole_value:
            return _as_template_string(self.value())
        out: list[str] = []
        for segment, node in zip(self.segments, self.nodes, strict=True):
            out.append(to_display_string(self.scope.run(node)) if isinstance(segment, Expr) else segment)
        return "".join(out)


def _interpolate(scope: Scope, text: str) -> str:
    if OPEN not in text:
        return text
    return _Template(scope, text).string()


def named_values(text: str, env: EvalEnv) -> frozenset[str]:
    """The contexts the `${{ }}` expressions of `text` name (lowercase), parsed as
    `interpolate` parses them: a caller learns, e.g., whether a value was made from `secrets`."""
    if OPEN not in text:
        return frozenset()
    nodes = _Template(Scope(env), text).nodes
    return frozenset(n.name.lower() for node in nodes if node for n in walk(node) if isinstance(n, NamedValue))


def interpolate(text: str, env: EvalEnv) -> str:
    """`text` with every `${{ expr }}` replaced by its value as a string."""
    return _interpolate(Scope(env), text)


def interpolate_tree(obj: Any, env: EvalEnv, *, keep_types: bool = False) -> Any:
    """Interpolate every string (and mapping key) of a nested dict/list, e.g. `with:` or `env:`.

    By default the result holds only strings, as GitHub gives `env:`/`with:` values (`true`
    → 'true', `3` → '3', null → ''). With `keep_types=True` (for keys such as
    `continue-on-error`, `timeout-minutes`, `strategy`) a value that is exactly one
    `${{ expr }}` keeps the expression's type and other scalars stay as they are.
    """
    scope = Scope(env)

    def walk_value(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {walk_key(k): walk_value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk_value(v) for v in value]
        if isinstance(value, str):
            if keep_types and OPEN in value:
                template = _Template(scope, value)
                return template.value() if template.whole_value else template.string()
            return _interpolate(scope, value)
        return value if keep_types else to_display_string(value)

    def walk_key(key: Any) -> Any:
        return _interpolate(scope, key) if isinstance(key, str) else to_display_string(key)

    return walk_value(obj)


def condition_expression(condition: Any) -> str:
    """The expression an `if:` value stands for, before the implicit `success() &&`."""
    if condition is None:
        return ""
    if condition is True or condition is False:
        return "true" if condition else "false"
    if isinstance(condition, (int, float)):
        return format_number(condition)
    if not isinstance(condition, str):
        raise ExpressionError(f"An if condition must be a string, not {type(condition).__name__}")
    segments = split_template(condition)
    if not any(isinstance(s, Expr) for s in segments):
        return condition
    sole = _sole(segments)
    if sole is not None:
        literal = _string_literal(sole.text)
        return literal if literal is not None else sole.text
    fmt: list[str] = []
    args: list[str] = []
    for segment in segments:
        if isinstance(segment, Expr):
            fmt.append("{" + str(len(args)) + "}")
            args.append(segment.text)
        else:
            fmt.append(segment.replace("'", "''").replace("{", "{{").replace("}", "}}"))
    return "format('" + "".join(fmt) + "'" + "".join(", " + a for a in args) + ")"


def _calls_status_function(node: Node) -> bool:
    return any(isinstance(n, Call) and n.info.name.lower() in STATUS_FUNCTIONS for n in walk(node))


def evaluate_if(condition: Any, env: EvalEnv) -> bool:
    """Whether an `if:` condition holds; status functions are always available here."""
    scope = Scope(env, status_functions=True)
    expression = condition_expression(condition)
    node = scope.parse(expression)
    if node is None:
        node = scope.parse("success()")
    elif not _calls_status_function(node):
        node = scope.parse(f"success() && ({expression})")
    return is_truthy(scope.run(node))
