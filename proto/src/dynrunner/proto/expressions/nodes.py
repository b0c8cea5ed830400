"""The expression tree and how each node evaluates (GitHub runner's `Sdk` nodes).

`&&`/`||` return an operand's value and stop at the first falsy/truthy one; `!` and the
comparisons return booleans; `.name`, `['name']`, `[0]` and `*` dereference objects
(ignoring the case of keys) and arrays, giving null when nothing is there. After a `*`, a
further index applies to each element of the filtered array and flattens one level.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dynrunner.proto.expressions.evaluation import MIN_OBJECT_SIZE, POINTER_SIZE, Evaluation
from dynrunner.proto.expressions.lexer import is_legal_keyword
from dynrunner.proto.expressions.values import (
    FilteredArray,
    Kind,
    format_number,
    greater_than,
    is_array,
    is_object,
    is_primitive,
    is_truthy,
    kind_of,
    less_than,
    lookup,
    loose_equal,
    to_display_string,
    to_number,
)

# What a node's core returns: its value, and the bytes it accounted itself (None = default).
Result = tuple[Any, int | None]
FunctionImpl = Callable[["Call", Evaluation, int], Result]


@dataclass(frozen=True)
class FunctionInfo:
    name: str
    min_args: int
    max_args: int
    impl: FunctionImpl
    from_data: bool = False  # returns values the way contexts hold them (fromJSON)


class Node:
    from_data = False

    def evaluate(self, ev: Evaluation, level: int) -> Any:
        value, result_bytes = self.core(ev, level)
        ev.account(level, value, result_bytes, self.from_data)
        return value

    def core(self, ev: Evaluation, level: int) -> Result:
        raise NotImplementedError

    def to_expression(self) -> str:
        raise NotImplementedError

    def children(self) -> list[Node]:
        return []


def format_literal(value: Any) -> str:
    k = kind_of(value)
    if k is Kind.NULL:
        return "null"
    if k is Kind.STRING:
        return "'" + value.replace("'", "''") + "'"
    if k is Kind.NUMBER:
        return format_number(value)
    return to_display_string(value)


class Literal(Node):
    def __init__(self, value: Any) -> None:
        self.value = value

    def core(self, ev: Evaluation, level: int) -> Result:
        return self.value, None

    def to_expression(self) -> str:
        return format_literal(self.value)


class Wildcard(Node):
    def core(self, ev: Evaluation, level: int) -> Result:
        return "*", None

    def to_expression(self) -> str:
        return "*"


class NamedValue(Node):
    from_data = True

    def __init__(self, name: str) -> None:
        self.name = name

    def core(self, ev: Evaluation, level: int) -> Result:
        return ev.values.get(self.name.lower()), None

    def to_expression(self) -> str:
        return self.name


class Container(Node):
    def __init__(self, params: list[Node] | None = None) -> None:
        self.params: list[Node] = params if params is not None else []

    def children(self) -> list[Node]:
        return self.params


class Not(Container):
    def core(self, ev: Evaluation, level: int) -> Result:
        return not is_truthy(self.params[0].evaluate(ev, level + 1)), None

    def to_expression(self) -> str:
        return "!" + self.params[0].to_expression()


class And(Container):
    def core(self, ev: Evaluation, level: int) -> Result:
        value: Any = None
        for param in self.params:
            value = param.evaluate(ev, level + 1)
            if not is_truthy(value):
                break
        return value, None

    def to_expression(self) -> str:
        return "(" + " && ".join(p.to_expression() for p in self.params) + ")"


class Or(Container):
    def core(self, ev: Evaluation, level: int) -> Result:
        value: Any = None
        for param in self.params:
            value = param.evaluate(ev, level + 1)
            if is_truthy(value):
                break
        return value, None

    def to_expression(self) -> str:
        return "(" + " || ".join(p.to_expression() for p in self.params) + ")"


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "==": loose_equal,
    "!=": lambda a, b: not loose_equal(a, b),
    ">": greater_than,
    "<": less_than,
    ">=": lambda a, b: loose_equal(a, b) or greater_than(a, b),
    "<=": lambda a, b: loose_equal(a, b) or less_than(a, b),
}


class Comparison(Container):
    def __init__(self, operator: str) -> None:
        super().__init__()
        self.operator = operator
        self._compare = _COMPARISONS[operator]

    def core(self, ev: Evaluation, level: int) -> Result:
        left = self.params[0].evaluate(ev, level + 1)
        right = self.params[1].evaluate(ev, level + 1)
        return self._compare(left, right), None

    def to_expression(self) -> str:
        return f"({self.params[0].to_expression()} {self.operator} {self.params[1].to_expression()})"


class Call(Container):
    def __init__(self, name: str, info: FunctionInfo) -> None:
        super().__init__()
        self.name = name
        self.info = info
        self.from_data = info.from_data

    def core(self, ev: Evaluation, level: int) -> Result:
        return self.info.impl(self, ev, level)

    def to_expression(self) -> str:
        return f"{self.name}({', '.join(p.to_expression() for p in self.params)})"


class _IndexKey:
    """The evaluated index of `[...]`, as an integer (arrays) and as a string (objects)."""

    def __init__(self, ev: Evaluation, node: Node, level: int) -> None:
        self.wildcard = isinstance(node, Wildcard)
        value = node.evaluate(ev, level)
        self.string = to_display_string(value) if is_primitive(value) else None
        number = to_number(value)
        floor = math.floor(number) if math.isfinite(number) and number >= 0 else None
        self.integer = floor if floor is not None and floor <= 2**31 - 1 else None


class Index(Container):
    from_data = True

    def core(self, ev: Evaluation, level: int) -> Result:
        left = self.params[0].evaluate(ev, level + 1)
        if not (is_array(left) or is_object(left)):
            return (FilteredArray() if isinstance(self.params[1], Wildcard) else None), None
        key = _IndexKey(ev, self.params[1], level + 1)
        if isinstance(left, FilteredArray):
            return self._filtered(ev, left, key)
        if is_object(left):
            if key.wildcard:
                return self._collect(ev, list(left.values()))
            if key.string is not None:
                return lookup(left, key.string, case_sensitive=ev.is_case_sensitive(left))[1], None
            return None, None
        if key.wildcard:
            return self._collect(ev, list(left))
        if key.integer is not None and key.integer < len(left):
            return left[key.integer], None
        return None, None

    def _collect(self, ev: Evaluation, items: list[Any]) -> Result:
        counter = ev.counter(self)
        counter.add(MIN_OBJECT_SIZE)
        result = FilteredArray()
        for item in items:
            result.append(item)
            counter.add(POINTER_SIZE)
        return result, counter.bytes

    def _filtered(self, ev: Evaluation, items: FilteredArray, key: _IndexKey) -> Result:
        counter = ev.counter(self)
        result = FilteredArray()
        for item in items:
            if isinstance(item, Mapping):
                if key.wildcard:
                    found = list(item.values())
                elif key.string is not None:
                    ok, value = lookup(item, key.string, case_sensitive=ev.is_case_sensitive(item))
                    found = [value] if ok else []
                else:
                    found = []
            elif is_array(item):
                if key.wildcard:
                    found = list(item)
                elif key.integer is not None and key.integer < len(item):
                    found = [item[key.integer]]
                else:
                    found = []
            else:
                continue
            for value in found:
                result.append(value)
                counter.add(POINTER_SIZE)
        return result, counter.bytes

    def to_expression(self) -> str:
        target, key = self.params
        if isinstance(key, Literal) and isinstance(key.value, str) and is_legal_keyword(key.value):
            return f"{target.to_expression()}.{key.value}"
        return f"{target.to_expression()}[{key.to_expression()}]"


def walk(node: Node) -> list[Node]:
    """Every node of a tree, root first."""
    out: list[Node] = []
    stack = [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(reversed(current.children()))
    return out
