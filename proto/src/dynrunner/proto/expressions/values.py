"""Values of the expression language and GitHub's rules for them.

Values are plain JSON-like Python: None, bool, int/float, str, list (arrays), Mapping
(objects). The rules follow the runner's `EvaluationResult` and `ExpressionUtility`:
truthiness, loose equality with its coercions (null/bool → number, string → number the
way JavaScript's `Number()` parses), case-insensitive ordinal string comparison, and
number → string formatting with 15 significant digits ("G15").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import IntEnum
from typing import Any


class Kind(IntEnum):
    NULL = 0
    BOOLEAN = 1
    NUMBER = 2
    STRING = 3
    ARRAY = 4
    OBJECT = 5


class FilteredArray(list[Any]):
    """The array an object filter (`*`) produces; a further index applies to each element."""


def kind_of(value: Any) -> Kind:
    if value is None:
        return Kind.NULL
    if value is True or value is False:
        return Kind.BOOLEAN
    if isinstance(value, (int, float)):
        return Kind.NUMBER
    if isinstance(value, str):
        return Kind.STRING
    if isinstance(value, (list, tuple)):
        return Kind.ARRAY
    return Kind.OBJECT


def is_primitive(value: Any) -> bool:
    return kind_of(value) <= Kind.STRING


def is_array(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def is_object(value: Any) -> bool:
    return isinstance(value, Mapping)


def kind_name(value: Any) -> str:
    return ("Null", "Boolean", "Number", "String", "Array", "Object")[kind_of(value)]


# --- whitespace, as .NET's Char.IsWhiteSpace (Python's isspace also counts U+001C..U+001F)

_NOT_DOTNET_SPACE = frozenset("\x1c\x1d\x1e\x1f")


def is_space(c: str) -> bool:
    return c.isspace() and c not in _NOT_DOTNET_SPACE


def dotnet_strip(s: str) -> str:
    start, end = 0, len(s)
    while start < end and is_space(s[start]):
        start += 1
    while end > start and is_space(s[end - 1]):
        end -= 1
    return s[start:end]


# --- numbers

_DECIMAL_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_HEX_RE = re.compile(r"0x[0-9a-fA-F]+\Z")
_OCTAL_RE = re.compile(r"0o[0-7]+\Z")
_INT32_MAX = 2**31 - 1


def _as_int32(value: int) -> int | None:
    """.NET parses hex/octal as a 32-bit two's-complement pattern: 0xffffffff is -1."""
    if value >= 2**32:
        return None
    return value - 2**32 if value > _INT32_MAX else value


def parse_number(text: str) -> float:
    """A string's number value as GitHub coerces it (JavaScript `Number()`-like); NaN if none."""
    s = dotnet_strip(text)
    if not s:
        return 0.0
    if _DECIMAL_RE.match(s):
        try:
            return float(s)
        except (OverflowError, ValueError):  # pragma: no cover - float() saturates to inf
            return math.nan
    if _HEX_RE.match(s):
        n = _as_int32(int(s[2:], 16))
        return math.nan if n is None else float(n)
    if _OCTAL_RE.match(s):
        n = _as_int32(int(s[2:], 8))
        return math.nan if n is None else float(n)
    # .NET's double parser also accepts the symbols, ignoring case, with an optional sign.
    folded = s.lower()
    if folded in ("infinity", "+infinity"):
        return math.inf
    if folded == "-infinity":
        return -math.inf
    return math.nan


def to_number(value: Any) -> float:
    k = kind_of(value)
    if k is Kind.NULL:
        return 0.0
    if k is Kind.BOOLEAN:
        return 1.0 if value else 0.0
    if k is Kind.NUMBER:
        return _float(value)
    if k is Kind.STRING:
        return parse_number(value)
    return math.nan


def _float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def format_number(value: int | float) -> str:
    """.NET's `ToString("G15")`; negative zero prints as "0" as in GitHub's conformance data."""
    x = _float(value)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "0"
    return format(x, ".15G")


# --- strings


def to_display_string(value: Any) -> str:
    """GitHub's value → string conversion (what `${{ }}` interpolation and `format` produce)."""
    k = kind_of(value)
    if k is Kind.NULL:
        return ""
    if k is Kind.BOOLEAN:
        return "true" if value else "false"
    if k is Kind.NUMBER:
        return format_number(value)
    if k is Kind.STRING:
        return str(value)
    return "Array" if k is Kind.ARRAY else "Object"


def _upper_char(c: str) -> str:
    u = c.upper()
    # Only one-to-one mappings, and never non-ASCII to ASCII (ı is not I, ſ is not S).
    return u if len(u) == 1 and (c.isascii() or not u.isascii()) else c


def fold(s: str) -> str:
    """Case-fold as .NET's OrdinalIgnoreCase does: simple per-character upper-casing."""
    if s.isascii():
        return s.upper()
    return "".join(map(_upper_char, s))


def _has_astral(s: str) -> bool:
    return bool(s) and max(s) > "\uffff"


def compare_strings(left: str, right: str) -> int:
    """Ordinal ignore-case comparison; ordinal means by UTF-16 code unit, as in .NET."""
    a, b = fold(left), fold(right)
    if a == b:
        return 0
    if _has_astral(a) or _has_astral(b):
        return -1 if a.encode("utf-16-be", "surrogatepass") < b.encode("utf-16-be", "surrogatepass") else 1
    return -1 if a < b else 1


def utf16_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-16-le", "surrogatepass")) // 2


# --- truthiness, equality, ordering


def is_truthy(value: Any) -> bool:
    k = kind_of(value)
    if k is Kind.NULL:
        return False
    if k is Kind.BOOLEAN:
        return bool(value)
    if k is Kind.NUMBER:
        x = _float(value)
        return not (x == 0 or math.isnan(x))
    if k is Kind.STRING:
        return value != ""
    return True


def _coerce(left: Any, right: Any) -> tuple[Any, Any, Kind, Kind]:
    lk, rk = kind_of(left), kind_of(right)
    while lk != rk:
        if lk is Kind.NUMBER and rk is Kind.STRING:
            right, rk = parse_number(right), Kind.NUMBER
        elif lk is Kind.STRING and rk is Kind.NUMBER:
            left, lk = parse_number(left), Kind.NUMBER
        elif lk in (Kind.BOOLEAN, Kind.NULL):
            left, lk = to_number(left), Kind.NUMBER
        elif rk in (Kind.BOOLEAN, Kind.NULL):
            right, rk = to_number(right), Kind.NUMBER
        else:
            break
    return left, right, lk, rk


def loose_equal(left: Any, right: Any) -> bool:
    left, right, lk, rk = _coerce(left, right)
    if lk != rk:
        return False
    if lk is Kind.NULL:
        return True
    if lk is Kind.NUMBER:
        a, b = _float(left), _float(right)
        return not (math.isnan(a) or math.isnan(b)) and a == b
    if lk is Kind.STRING:
        return fold(left) == fold(right)
    if lk is Kind.BOOLEAN:
        return bool(left) == bool(right)
    return left is right


def _order(left: Any, right: Any) -> int | None:
    """-1/0/1 for comparable operands after coercion, None when `<`/`>` are both false."""
    left, right, lk, rk = _coerce(left, right)
    if lk != rk:
        return None
    if lk is Kind.NUMBER:
        a, b = _float(left), _float(right)
        if math.isnan(a) or math.isnan(b):
            return None
        return (a > b) - (a < b)
    if lk is Kind.STRING:
        return compare_strings(left, right)
    if lk is Kind.BOOLEAN:
        return int(bool(left)) - int(bool(right))
    return None


def greater_than(left: Any, right: Any) -> bool:
    return _order(left, right) == 1


def less_than(left: Any, right: Any) -> bool:
    return _order(left, right) == -1


# --- property lookup


def lookup(obj: Mapping[str, Any], key: str, *, case_sensitive: bool = False) -> tuple[bool, Any]:
    """Find `key` in an object: exact first, then ignoring case (GitHub's objects ignore case)."""
    try:
        return True, obj[key]
    except KeyError:
        pass
    except TypeError:
        return False, None
    if case_sensitive:
        return False, None
    wanted = fold(key)
    for name, value in obj.items():
        if isinstance(name, str) and fold(name) == wanted:
            return True, value
    return False, None
