"""Tokens of an expression, with the runner's rules for which token may follow which.

Follows `LexicalAnalyzer` of GitHub's runner: a token that may not follow the previous
one becomes `UNEXPECTED` (the parser reports it as "Unexpected symbol"), `(` is a function
call only right after a function name, `.` starts a number where an operand is expected,
and keywords may contain `-`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from dynrunner.proto.expressions.values import is_space, parse_number


class TokenKind(Enum):
    START_GROUP = auto()  # "(" logical grouping
    START_INDEX = auto()  # "["
    START_PARAMETERS = auto()  # "(" function call
    END_GROUP = auto()
    END_INDEX = auto()
    END_PARAMETERS = auto()
    SEPARATOR = auto()
    DEREFERENCE = auto()
    WILDCARD = auto()
    LOGICAL_OPERATOR = auto()
    NUMBER = auto()
    STRING = auto()
    BOOLEAN = auto()
    NULL = auto()
    PROPERTY_NAME = auto()
    FUNCTION = auto()
    NAMED_VALUE = auto()
    UNEXPECTED = auto()


K = TokenKind

OPERATOR_KINDS = frozenset(
    {
        K.START_GROUP,
        K.START_INDEX,
        K.START_PARAMETERS,
        K.END_GROUP,
        K.END_INDEX,
        K.END_PARAMETERS,
        K.SEPARATOR,
        K.DEREFERENCE,
        K.LOGICAL_OPERATOR,
    }
)

_BOUNDARY = frozenset("([)],.!><=&|")
_TWO_CHAR_OPERATORS = frozenset({"!=", ">=", "<=", "==", "&&", "||"})
_ONE_CHAR_OPERATORS = frozenset({"!", ">", "<"})

# What each token kind may follow (None = start of the expression).
_AFTER_VALUE = frozenset(
    {K.END_GROUP, K.END_PARAMETERS, K.END_INDEX, K.WILDCARD, K.NULL, K.BOOLEAN, K.NUMBER, K.STRING}
    | {K.PROPERTY_NAME, K.NAMED_VALUE}
)
_AFTER_COLLECTION = frozenset({K.END_GROUP, K.END_PARAMETERS, K.END_INDEX, K.WILDCARD, K.PROPERTY_NAME, K.NAMED_VALUE})
_OPERAND_POSITION: frozenset[TokenKind | None] = frozenset(
    {None, K.SEPARATOR, K.START_INDEX, K.START_GROUP, K.START_PARAMETERS, K.LOGICAL_OPERATOR}
)
_LEGAL_AFTER: dict[TokenKind, frozenset[Any]] = {
    K.START_GROUP: _OPERAND_POSITION,
    K.START_INDEX: _AFTER_COLLECTION,
    K.START_PARAMETERS: frozenset({K.FUNCTION}),
    K.END_GROUP: _AFTER_VALUE,
    K.END_INDEX: _AFTER_VALUE,
    K.END_PARAMETERS: _AFTER_VALUE | {K.START_PARAMETERS},
    K.SEPARATOR: _AFTER_VALUE,
    K.DEREFERENCE: _AFTER_COLLECTION,
    K.WILDCARD: frozenset({K.START_INDEX, K.DEREFERENCE}),
    K.NULL: _OPERAND_POSITION,
    K.BOOLEAN: _OPERAND_POSITION,
    K.NUMBER: _OPERAND_POSITION,
    K.STRING: _OPERAND_POSITION,
    K.PROPERTY_NAME: frozenset({K.DEREFERENCE}),
    K.FUNCTION: _OPERAND_POSITION,
    K.NAMED_VALUE: _OPERAND_POSITION,
}

_OPENERS = {K.END_GROUP: K.START_GROUP, K.END_INDEX: K.START_INDEX, K.END_PARAMETERS: K.START_PARAMETERS}
_PRECEDENCE = {"!": 16, ">": 11, ">=": 11, "<": 11, "<=": 11, "==": 10, "!=": 10, "&&": 6, "||": 5}


@dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    raw: str
    index: int
    value: Any = None

    @property
    def is_operator(self) -> bool:
        return self.kind in OPERATOR_KINDS

    @property
    def left_to_right(self) -> bool:
        if self.kind is K.START_GROUP or (self.kind is K.LOGICAL_OPERATOR and self.raw == "!"):
            return False
        return self.is_operator

    @property
    def precedence(self) -> int:
        kind = self.kind
        if kind is K.START_GROUP:
            return 20
        if kind in (K.START_INDEX, K.START_PARAMETERS, K.DEREFERENCE):
            return 19
        if kind is K.LOGICAL_OPERATOR:
            return _PRECEDENCE[self.raw]
        if kind in (K.END_GROUP, K.END_INDEX, K.END_PARAMETERS, K.SEPARATOR):
            return 1
        return 0

    @property
    def operand_count(self) -> int:
        if self.kind in (K.START_INDEX, K.DEREFERENCE):
            return 2
        if self.kind is K.LOGICAL_OPERATOR:
            return 1 if self.raw == "!" else 2
        return 0


def is_legal_keyword(s: str) -> bool:
    if not s:
        return False
    first = s[0]
    if not (first == "_" or ("a" <= first <= "z") or ("A" <= first <= "Z")):
        return False
    return all(c in "_-" or ("a" <= c <= "z") or ("A" <= c <= "Z") or ("0" <= c <= "9") for c in s[1:])


def _is_boundary(c: str) -> bool:
    return c in _BOUNDARY or is_space(c)


class Lexer:
    """Produces tokens one at a time; `unclosed` tracks open `(`/`[` for the parser."""

    def __init__(self, expression: str) -> None:
        self._expr = expression
        self._i = 0
        self._last: Token | None = None
        self.unclosed: list[Token] = []

    def next_token(self) -> Token | None:
        expr, n = self._expr, len(self._expr)
        while self._i < n and is_space(expr[self._i]):
            self._i += 1
        if self._i >= n:
            return None
        c = expr[self._i]
        start = self._i
        token: Token
        if c == "(":
            self._i += 1
            if self._last is not None and self._last.kind is K.FUNCTION:
                token = self._create(K.START_PARAMETERS, c, start)
            else:
                token = self._create(K.START_GROUP, c, start)
        elif c == "[":
            self._i += 1
            token = self._create(K.START_INDEX, c, start)
        elif c == ")":
            self._i += 1
            if self.unclosed and self.unclosed[-1].kind is K.START_PARAMETERS:
                token = self._create(K.END_PARAMETERS, c, start)
            else:
                token = self._create(K.END_GROUP, c, start)
        elif c == "]":
            self._i += 1
            token = self._create(K.END_INDEX, c, start)
        elif c == ",":
            self._i += 1
            token = self._create(K.SEPARATOR, c, start)
        elif c == "*":
            self._i += 1
            token = self._create(K.WILDCARD, c, start)
        elif c == "'":
            token = self._read_string()
        elif c in "!><=&|":
            token = self._read_operator()
        elif c == ".":
            if self._last is None or self._last.kind in (
                K.SEPARATOR,
                K.START_GROUP,
                K.START_INDEX,
                K.START_PARAMETERS,
                K.LOGICAL_OPERATOR,
            ):
                token = self._read_number()
            else:
                self._i += 1
                token = self._create(K.DEREFERENCE, c, start)
        elif c in "-+" or "0" <= c <= "9":
            token = self._read_number()
        else:
            token = self._read_keyword()
        self._last = token
        return token

    def _read_number(self) -> Token:
        expr, n = self._expr, len(self._expr)
        start = self._i
        self._i += 1
        while self._i < n and (not _is_boundary(expr[self._i]) or expr[self._i] == "."):
            self._i += 1
        raw = expr[start : self._i]
        number = parse_number(raw)
        if math.isnan(number):  # not a number literal
            return Token(K.UNEXPECTED, raw, start)
        return self._create(K.NUMBER, raw, start, number)

    def _read_keyword(self) -> Token:
        expr, n = self._expr, len(self._expr)
        start = self._i
        self._i += 1
        while self._i < n and not _is_boundary(expr[self._i]):
            self._i += 1
        raw = expr[start : self._i]
        if not is_legal_keyword(raw):
            return Token(K.UNEXPECTED, raw, start)
        if self._last is not None and self._last.kind is K.DEREFERENCE:
            return self._create(K.PROPERTY_NAME, raw, start)
        if raw == "null":
            return self._create(K.NULL, raw, start)
        if raw in ("true", "false"):
            return self._create(K.BOOLEAN, raw, start, raw == "true")
        if raw == "NaN":
            return self._create(K.NUMBER, raw, start, float("nan"))
        if raw == "Infinity":
            return self._create(K.NUMBER, raw, start, float("inf"))
        look = self._i
        while look < n and is_space(expr[look]):
            look += 1
        if look < n and expr[look] == "(":
            return self._create(K.FUNCTION, raw, start)
        return self._create(K.NAMED_VALUE, raw, start)

    def _read_string(self) -> Token:
        expr, n = self._expr, len(self._expr)
        start = self._i
        self._i += 1
        chars: list[str] = []
        closed = False
        while self._i < n:
            c = expr[self._i]
            self._i += 1
            if c == "'":
                if self._i >= n or expr[self._i] != "'":
                    closed = True
                    break
                self._i += 1  # '' is an escaped quote
            chars.append(c)
        raw = expr[start : self._i]
        if closed:
            return self._create(K.STRING, raw, start, "".join(chars))
        return Token(K.UNEXPECTED, raw, start)

    def _read_operator(self) -> Token:
        expr, n = self._expr, len(self._expr)
        start = self._i
        self._i += 1
        if self._i < n:
            two = expr[start : start + 2]
            if two in _TWO_CHAR_OPERATORS:
                self._i += 1
                return self._create(K.LOGICAL_OPERATOR, two, start)
        one = expr[start]
        if one in _ONE_CHAR_OPERATORS:
            return self._create(K.LOGICAL_OPERATOR, one, start)
        while self._i < n and not _is_boundary(expr[self._i]):
            self._i += 1
        return Token(K.UNEXPECTED, expr[start : self._i], start)

    def _create(self, kind: TokenKind, raw: str, index: int, value: Any = None) -> Token:
        last_kind = self._last.kind if self._last is not None else None
        if kind is K.LOGICAL_OPERATOR:
            legal = last_kind in (_OPERAND_POSITION if raw == "!" else _AFTER_VALUE)
        else:
            legal = last_kind in _LEGAL_AFTER[kind]
        if not legal:
            return Token(K.UNEXPECTED, raw, index)
        token = Token(kind, raw, index, value)
        if kind in (K.START_GROUP, K.START_INDEX, K.START_PARAMETERS):
            self.unclosed.append(token)
        elif kind in (K.END_GROUP, K.END_INDEX, K.END_PARAMETERS):
            opener = _OPENERS[kind]
            if not self.unclosed or self.unclosed[-1].kind is not opener:
                return Token(K.UNEXPECTED, raw, index)
            self.unclosed.pop()
        elif kind is K.SEPARATOR and (not self.unclosed or self.unclosed[-1].kind is not K.START_PARAMETERS):
            return Token(K.UNEXPECTED, raw, index)
        return token
