"""The functions of the language, with the runner's arities and edge cases.

Built-in everywhere: `contains`, `startsWith`, `endsWith`, `format`, `join`, `toJSON`,
`fromJSON`, `case`. Special, allowed only where GitHub allows them: the status functions
`success`, `always`, `failure`, `cancelled` (answered from the caller's job status) and
`hashFiles` (answered by the caller, who knows the workspace). Names ignore case.
"""

from __future__ import annotations

from typing import Any

from dynrunner.proto.expressions.errors import ExpressionError
from dynrunner.proto.expressions.evaluation import Evaluation
from dynrunner.proto.expressions.jsonio import from_json, to_json
from dynrunner.proto.expressions.nodes import Call, FunctionInfo, Result
from dynrunner.proto.expressions.values import (
    fold,
    is_array,
    is_primitive,
    kind_name,
    loose_equal,
    to_display_string,
)

MAX_ARGS = 255  # the runner's Byte.MaxValue


def _arg(call: Call, ev: Evaluation, level: int, i: int) -> Any:
    return call.params[i].evaluate(ev, level + 1)


def _text_test(left: Any, right: Any, test: str) -> bool:
    haystack, needle = fold(to_display_string(left)), fold(to_display_string(right))
    if test == "contains":
        return needle in haystack
    if test == "startsWith":
        return haystack.startswith(needle)
    return haystack.endswith(needle)


def _string_test(test: str) -> Any:
    def impl(call: Call, ev: Evaluation, level: int) -> Result:
        left = _arg(call, ev, level, 0)
        if not is_primitive(left):
            return False, None
        right = _arg(call, ev, level, 1)
        return is_primitive(right) and _text_test(left, right, test), None

    return impl


def _contains(call: Call, ev: Evaluation, level: int) -> Result:
    left = _arg(call, ev, level, 0)
    if is_primitive(left):
        right = _arg(call, ev, level, 1)
        return is_primitive(right) and _text_test(left, right, "contains"), None
    if is_array(left) and len(left) > 0:
        right = _arg(call, ev, level, 1)
        return any(loose_equal(right, item) for item in left), None
    return False, None


def _format(call: Call, ev: Evaluation, level: int) -> Result:
    fmt = to_display_string(_arg(call, ev, level, 0))
    counter = ev.counter(call)
    segments: list[str | tuple[int, str]] = []

    def literal(text: str) -> None:
        if text:
            counter.add_string(text)
            segments.append(text)

    def char_at(i: int) -> str:
        return fmt[i] if i < len(fmt) else "\0"

    def invalid() -> ExpressionError:
        return ExpressionError(f"The following format string is invalid: {fmt}")

    index = 0
    while index < len(fmt):
        lbrace, rbrace = fmt.find("{", index), fmt.find("}", index)
        if lbrace >= 0 and (rbrace < 0 or rbrace > lbrace):
            if char_at(lbrace + 1) == "{":
                literal(fmt[index : lbrace + 1])
                index = lbrace + 2
                continue
            placeholder = _read_placeholder(fmt, lbrace + 1) if rbrace > lbrace + 1 else None
            if placeholder is None:
                raise invalid()
            arg_index, specifiers, rbrace = placeholder
            if arg_index > len(call.params) - 2:
                raise ExpressionError(
                    f"The following format string references more arguments than were supplied: {fmt}"
                )
            literal(fmt[index:lbrace])
            segments.append((arg_index, specifiers))
            index = rbrace + 1
        elif rbrace >= 0:
            if char_at(rbrace + 1) != "}":
                raise invalid()
            literal(fmt[index : rbrace + 1])
            index = rbrace + 2
        else:
            literal(fmt[index:])
            break

    cache: dict[int, tuple[Any, str]] = {}
    out: list[str] = []
    for segment in segments:
        if isinstance(segment, str):
            out.append(segment)
            continue
        arg_index, specifiers = segment
        if arg_index not in cache:
            value = _arg(call, ev, level, arg_index + 1)
            cache[arg_index] = (value, to_display_string(value))
        value, text = cache[arg_index]
        if specifiers:
            raise ExpressionError(
                f"The format specifiers '{specifiers}' are not valid for objects of type '{kind_name(value)}'"
            )
        if text:
            counter.add_string(text)
        out.append(text)
    return "".join(out), None


def _read_placeholder(fmt: str, start: int) -> tuple[int, str, int] | None:
    """`{N}` or `{N:spec}` starting after the `{`: (N, spec, index of the closing `}`)."""
    end = start
    while end < len(fmt) and fmt[end].isdecimal():
        end += 1
    digits = fmt[start:end]
    if not digits or not digits.isascii() or len(digits.lstrip("0")) > 3 or int(digits) > MAX_ARGS:
        return None
    if end < len(fmt) and fmt[end] == "}":
        return int(digits), "", end
    if end >= len(fmt) or fmt[end] != ":":
        return None
    spec: list[str] = []
    i = end + 1
    while i < len(fmt):
        if fmt[i] != "}":
            spec.append(fmt[i])
            i += 1
        elif i + 1 < len(fmt) and fmt[i + 1] == "}":
            spec.append("}")
            i += 2
        else:
            return int(digits), "".join(spec), i
    return None


def _join(call: Call, ev: Evaluation, level: int) -> Result:
    items = _arg(call, ev, level, 0)
    if is_array(items) and len(items) > 0:
        counter = ev.counter(call)
        first = to_display_string(items[0])
        counter.add_string(first)
        parts = [first]
        if len(items) > 1:
            separator = ","
            if len(call.params) > 1:
                candidate = _arg(call, ev, level, 1)
                if is_primitive(candidate):
                    separator = to_display_string(candidate)
            for item in items[1:]:
                text = to_display_string(item)
                counter.add_string(separator)
                counter.add_string(text)
                parts.append(separator)
                parts.append(text)
        return "".join(parts), None
    if is_primitive(items):
        return to_display_string(items), None
    return "", None


def _to_json(call: Call, ev: Evaluation, level: int) -> Result:
    return to_json(_arg(call, ev, level, 0), ev.counter(call)), None


def _from_json(call: Call, ev: Evaluation, level: int) -> Result:
    return from_json(to_display_string(_arg(call, ev, level, 0))), None


def _case(call: Call, ev: Evaluation, level: int) -> Result:
    last = len(call.params) - 1
    for i in range(0, last, 2):
        predicate = _arg(call, ev, level, i)
        if predicate is not True and predicate is not False:
            raise ExpressionError("case predicate must evaluate to a boolean value")
        if predicate:
            return _arg(call, ev, level, i + 1), None
    return _arg(call, ev, level, last), None


def _status(wanted: str | None) -> Any:
    def impl(call: Call, ev: Evaluation, level: int) -> Result:
        return (True if wanted is None else ev.job_status == wanted), None

    return impl


def _hash_files(call: Call, ev: Evaluation, level: int) -> Result:
    args = [to_display_string(_arg(call, ev, level, i)) for i in range(len(call.params))]
    if ev.hash_files is None:
        patterns = args[1:] if args[0].startswith("--") else args
        joined = ", ".join(patterns).replace("'", "''")
        raise ExpressionError(f"hashFiles('{joined}') failed: the job workspace is not known here")
    return ev.hash_files(args), None


def _info(name: str, min_args: int, max_args: int, impl: Any, *, from_data: bool = False) -> tuple[str, FunctionInfo]:
    return name.lower(), FunctionInfo(name, min_args, max_args, impl, from_data)


BUILTIN_FUNCTIONS: dict[str, FunctionInfo] = dict(
    [
        _info("case", 3, MAX_ARGS, _case),
        _info("contains", 2, 2, _contains),
        _info("endsWith", 2, 2, _string_test("endsWith")),
        _info("format", 1, MAX_ARGS, _format),
        _info("join", 1, 2, _join),
        _info("startsWith", 2, 2, _string_test("startsWith")),
        _info("toJson", 1, 1, _to_json),
        _info("fromJson", 1, 1, _from_json, from_data=True),
    ]
)

STATUS_FUNCTIONS: dict[str, FunctionInfo] = dict(
    [
        _info("success", 0, 0, _status("success")),
        _info("always", 0, 0, _status(None)),
        _info("failure", 0, 0, _status("failure")),
        _info("cancelled", 0, 0, _status("cancelled")),
    ]
)

SPECIAL_FUNCTIONS: dict[str, FunctionInfo] = {
    **STATUS_FUNCTIONS,
    **dict([_info("hashFiles", 1, MAX_ARGS, _hash_files)]),
}
