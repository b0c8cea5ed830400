"""`toJSON` and `fromJSON` as the runner does them.

`toJSON` is the runner's own pretty printer (2-space indent, `\\n`, numbers formatted as
the language formats them, strings escaped like Newtonsoft.Json). `fromJSON` reads like
Newtonsoft's `JToken.ReadFrom` with the runner's settings: it is lenient in the same ways
(single quotes, unquoted property names, comments, `NaN`/`Infinity`, trailing commas,
hex/octal integers), stops after the first value, nests at most 64 deep, and merges keys
that differ only in case because the result is a case-insensitive object.
"""

from __future__ import annotations

import re
from typing import Any

from dynrunner.proto.expressions.errors import ExpressionError
from dynrunner.proto.expressions.evaluation import MemoryCounter
from dynrunner.proto.expressions.values import fold, format_number, is_array, is_object, is_space

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f\u0085\u2028\u2029]')


def _escape_char(match: re.Match[str]) -> str:
    c = match.group(0)
    return _ESCAPES.get(c) or f"\\u{ord(c):04x}"


def json_string(s: str) -> str:
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, s) + '"'


def to_json(value: Any, counter: MemoryCounter) -> str:
    parts: list[str] = []

    def emit(piece: str) -> None:
        counter.add_string(piece)
        parts.append(piece)

    def write(current: Any, depth: int, prefix: str) -> None:
        if is_array(current) or is_object(current):
            items = list(current.items()) if is_object(current) else list(current)
            if not items:
                emit(prefix + ("{}" if is_object(current) else "[]"))
                return
            emit(prefix + ("{" if is_object(current) else "["))
            indent = "\n" + "  " * (depth + 1)
            for i, item in enumerate(items):
                lead = ("," if i else "") + indent
                if is_object(current):
                    key, child = item
                    emit(lead + json_string(str(key)))
                    write(child, depth + 1, ": ")
                else:
                    write(item, depth + 1, lead)
            emit("\n" + "  " * depth + ("}" if is_object(current) else "]"))
        elif current is None:
            emit(prefix + "null")
        elif current is True or current is False:
            emit(prefix + ("true" if current else "false"))
        elif isinstance(current, (int, float)):
            emit(prefix + format_number(current))
        elif isinstance(current, str):
            emit(prefix + json_string(current))
        else:
            emit(prefix + "{}")  # a value the runner cannot traverse

    try:
        write(value, 0, "")
    except RecursionError:
        raise ExpressionError("toJSON: the value is nested too deeply") from None
    return "".join(parts)


# --- fromJSON

_MAX_DEPTH = 64
_NUMBER_CHARS = frozenset("-+aAbBcCdDeEfFxX.0123456789")
_SIMPLE_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", "\\": "\\", '"': '"', "'": "'", "/": "/"}
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_INT_RE = re.compile(r"-?[0-9]+\Z")
_UNDEFINED = object()
_LITERALS = {"t": "true", "f": "false", "n": "null", "u": "undefined", "N": "NaN", "I": "Infinity"}
_LITERAL_VALUES: dict[str, Any] = {
    "true": True,
    "false": False,
    "null": None,
    "undefined": _UNDEFINED,
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}
_LITERAL_ERRORS = {
    "true": "Error parsing boolean value.",
    "false": "Error parsing boolean value.",
    "null": "Error parsing null value.",
    "undefined": "Error parsing undefined value.",
    "NaN": "Cannot read NaN value.",
    "Infinity": "Cannot read Infinity value.",
    "-Infinity": "Cannot read -Infinity value.",
}


class _JsonReader:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.path: list[str | int] = []
        self.started = False

    def fail(self, message: str) -> ExpressionError:
        line = self.s.count("\n", 0, self.i) + 1 if self.started else 0
        line_start = self.s.rfind("\n", 0, self.i) + 1
        position = self.i - line_start if self.started else 0
        path = ""
        for part in self.path:
            if isinstance(part, int):
                path += f"[{part}]"
            elif re.fullmatch(r"[A-Za-z0-9_$-]+", part):
                path += ("." if path else "") + part
            else:
                path += "['" + part.replace("'", "\\'") + "']"
        message = message.rstrip()
        if not message.endswith("."):
            message += "."
        return ExpressionError(f"{message} Path '{path}', line {line}, position {position}.")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def skip(self) -> None:
        """Skip whitespace and comments (the runner's reader ignores comments inside values)."""
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if is_space(c):
                self.i += 1
            elif c == "/" and s.startswith("/*", self.i):
                end = s.find("*/", self.i + 2)
                if end < 0:
                    self.i = n
                    raise self.fail("Unexpected end while parsing comment.")
                self.i = end + 2
            elif c == "/" and s.startswith("//", self.i):
                end = s.find("\n", self.i)
                self.i = n if end < 0 else end + 1
            elif c == "/":
                self.i += 1
                raise self.fail(f"Error parsing comment. Expected: *, got {self.peek() or 'end'}.")
            else:
                return

    def value(self, depth: int) -> Any:
        self.skip()
        self.started = True
        c = self.peek()
        if not c:
            raise self.fail("Unexpected end when reading JSON.")
        if c in "\"'":
            return self.string(c)
        if c == "{":
            return self.obj(depth + 1)
        if c == "[":
            return self.array(depth + 1)
        if c == "-" and self.s.startswith("-I", self.i):
            return self.literal("-Infinity")
        if c in _LITERALS:
            return self.literal(_LITERALS[c])
        if c.isnumeric() or c in "-.":
            return self.number()
        raise self.fail(f"Unexpected character encountered while parsing value: {c}.")

    def at_separator(self) -> bool:
        c = self.peek()
        return not c or is_space(c) or c in ",}])/"

    def literal(self, word: str) -> Any:
        if not self.s.startswith(word, self.i):
            raise self.fail(_LITERAL_ERRORS[word])
        self.i += len(word)
        if not self.at_separator():
            raise self.fail(_LITERAL_ERRORS[word])
        return _LITERAL_VALUES[word]

    def number(self) -> float:
        start = self.i
        while self.i < len(self.s) and self.s[self.i] in _NUMBER_CHARS:
            self.i += 1
        if not self.at_separator():
            raise self.fail(f"Unexpected character encountered while parsing number: {self.peek()}.")
        text = self.s[start : self.i]
        if len(text) > 1 and text[0] == "0" and text[1] not in ".eE":
            try:
                n = int(text[2:], 16) if text[:2].lower() == "0x" else int(text, 8)
                if n >= 2**64:
                    raise ValueError
            except ValueError:
                raise self.fail(f"Input string '{text}' is not a valid number.") from None
            return float(n - 2**64 if n >= 2**63 else n)
        if _INT_RE.match(text) or _FLOAT_RE.match(text):
            return float(text)
        raise self.fail(f"Input string '{text}' is not a valid number.")

    def string(self, quote: str) -> str:
        s, n = self.s, len(self.s)
        self.i += 1
        out: list[str] = []
        while True:
            end = self.i
            while end < n and s[end] != quote and s[end] != "\\":
                end += 1
            out.append(s[self.i : end])
            self.i = end
            if end >= n:
                raise self.fail(f"Unterminated string. Expected delimiter: {quote}.")
            self.i += 1
            if s[end] == quote:
                return "".join(out)
            esc = self.peek()
            if not esc:
                raise self.fail(f"Unterminated string. Expected delimiter: {quote}.")
            self.i += 1
            if esc in _SIMPLE_ESCAPES:
                out.append(_SIMPLE_ESCAPES[esc])
            elif esc == "u":
                digits = s[self.i : self.i + 4]
                if len(digits) < 4:
                    raise self.fail("Unexpected end while parsing Unicode escape sequence.")
                if not re.fullmatch(r"[0-9a-fA-F]{4}", digits):
                    raise self.fail(f"Invalid Unicode escape sequence: \\u{digits}.")
                out.append(chr(int(digits, 16)))
                self.i += 4
            else:
                raise self.fail(f"Bad JSON escape sequence: \\{esc}.")

    def check_depth(self, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise self.fail(f"The reader's MaxDepth of {_MAX_DEPTH} has been exceeded.")

    def array(self, depth: int) -> list[Any]:
        self.check_depth(depth)
        self.i += 1
        result: list[Any] = []
        while True:
            self.skip()
            c = self.peek()
            if c == "]":
                self.i += 1
                return result
            if not c:
                raise self.fail("Unexpected end when reading JSON.")
            self.path.append(len(result))
            item = _UNDEFINED if c == "," else self.value(depth)
            result.append("" if item is _UNDEFINED else item)  # `undefined` becomes an empty string
            self.path.pop()
            self.skip()
            c = self.peek()
            if c == ",":
                self.i += 1
            elif c != "]":
                if not c:
                    raise self.fail("Unexpected end when reading JSON.")
                raise self.fail(f"After parsing a value an unexpected character was encountered: {c}.")

    def property_name(self) -> str:
        c = self.peek()
        if c in "\"'":
            return self.string(c)
        start = self.i
        while self.i < len(self.s) and (self.s[self.i].isalnum() or self.s[self.i] in "_$"):
            self.i += 1
        if self.i == start:
            raise self.fail(f"Invalid property identifier character: {c}.")
        return self.s[start : self.i]

    def obj(self, depth: int) -> dict[str, Any]:
        self.check_depth(depth)
        self.i += 1
        result: dict[str, Any] = {}
        folded: dict[str, str] = {}
        while True:
            self.skip()
            c = self.peek()
            if c == "}":
                self.i += 1
                return result
            if not c:
                raise self.fail("Unexpected end when reading JSON.")
            name = self.property_name()
            self.skip()
            if self.peek() != ":":
                raise self.fail(f"Invalid character after parsing property name. Expected ':' but got: {self.peek()}.")
            self.i += 1
            self.path.append(name)
            item = self.value(depth)
            self.path.pop()
            key = folded.setdefault(fold(name), name)  # case-insensitive object: first spelling wins
            result[key] = "" if item is _UNDEFINED else item
            self.skip()
            c = self.peek()
            if c == ",":
                self.i += 1
            elif c != "}":
                if not c:
                    raise self.fail("Unexpected end when reading JSON.")
                raise self.fail(f"After parsing a value an unexpected character was encountered: {c}.")


def from_json(text: str) -> Any:
    reader = _JsonReader(text)
    reader.skip()
    if reader.i >= len(text):
        raise reader.fail("Error reading JToken from JsonReader.")
    result = reader.value(0)
    return "" if result is _UNDEFINED else result
