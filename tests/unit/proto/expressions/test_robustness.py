"""Property-based tests: the parser and evaluator never fail with anything but ExpressionError,
and values survive the round trips the language offers."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynrunner.proto.expressions import EvalEnv, ExpressionError, evaluate, evaluate_if, interpolate
from dynrunner.proto.expressions.evaluator import Scope
from dynrunner.proto.expressions.nodes import format_literal
from dynrunner.proto.expressions.values import fold, format_number, to_display_string

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

keys = st.text(st.characters(codec="utf-8"), max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)
contexts = st.dictionaries(st.sampled_from(["github", "env", "matrix", "steps", "a"]), json_values, max_size=5)

TOKENS = [
    "github", "env", "matrix", "steps", "a", ".", "*", "[", "]", "(", ")", ",", "!", "==", "!=", "<", "<=",
    ">", ">=", "&&", "||", "'x'", "''", "'", "1", "-1.5e3", "0xff", "0o7", "NaN", "Infinity", "null", "true",
    "false", "contains", "format", "join", "toJSON", "fromJSON", "startsWith", "endsWith", "case", "success",
    "always", "hashFiles", "'{0}'", "'[1,{}]'", " ", "\t", "${{", "}}", "nope", "_a-b", "😊", "\u00a0",
]  # fmt: skip
token_soup = st.lists(st.sampled_from(TOKENS), max_size=25).map("".join)
any_text = st.one_of(token_soup, st.text(max_size=60))


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


@SETTINGS
@given(expression=any_text, ctx=contexts, status=st.sampled_from(["success", "failure", "cancelled"]))
def test_evaluation_fails_only_with_expression_error(expression: str, ctx: dict[str, Any], status: str) -> None:
    env = EvalEnv(contexts=ctx, job_status=status)
    for run in (evaluate, interpolate, evaluate_if):
        try:
            run(expression, env)
        except ExpressionError as error:
            assert str(error)


@SETTINGS
@given(expression=token_soup, ctx=contexts)
def test_printed_tree_parses_back_to_itself(expression: str, ctx: dict[str, Any]) -> None:
    scope = Scope(EvalEnv(contexts=ctx))
    try:
        node = scope.parse(expression)
    except ExpressionError:
        return
    if node is None:
        return
    printed = node.to_expression()
    reparsed = scope.parse(printed)
    assert reparsed is not None
    assert reparsed.to_expression() == printed
    try:
        first = scope.run(node)
    except ExpressionError as error:
        try:
            scope.run(reparsed)
        except ExpressionError as again:
            assert str(again).split(":")[0] == str(error).split(":")[0]
            return
        raise AssertionError(f"{printed!r} evaluated but {expression!r} failed: {error}") from None
    assert same(scope.run(reparsed), first)


@SETTINGS
@given(text=st.text(max_size=200))
def test_string_literals_round_trip(text: str) -> None:
    assert evaluate(format_literal(text), EvalEnv()) == text
    assert interpolate("${{ " + format_literal(text) + " }}", EvalEnv()) == text


@SETTINGS
@given(text=st.text(max_size=200).filter(lambda t: "${{" not in t))
def test_text_without_expressions_is_unchanged(text: str) -> None:
    assert interpolate(text, EvalEnv()) == text


@SETTINGS
@given(number=st.floats(allow_nan=False, min_value=-1e308, max_value=1e308) | st.sampled_from([math.inf, -math.inf]))
def test_numbers_round_trip_through_their_text(number: float) -> None:
    # (Near the largest double, 15 digits round up to a text that parses as Infinity, as in .NET.)
    printed = format_number(number)
    value = evaluate(printed, EvalEnv())
    assert value == float(format(number, ".15g")) or (number == 0 and value == 0)
    assert format_number(value) == printed
    assert evaluate(f"format('{{0}}', {printed})", EvalEnv()) == to_display_string(number)


def _unique_keys(value: Any) -> bool:
    if isinstance(value, dict):
        folded = [fold(k) for k in value]
        return len(set(folded)) == len(folded) and all(_unique_keys(v) for v in value.values())
    if isinstance(value, list):
        return all(_unique_keys(v) for v in value)
    return True


json_exact = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**15), 10**15)
    | st.floats(allow_nan=False, allow_infinity=False).map(lambda f: float(format(f, ".15g")))
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=15,
).filter(_unique_keys)


@SETTINGS
@given(value=json_exact)
def test_from_json_of_to_json_is_the_value(value: Any) -> None:
    env = EvalEnv(contexts={"v": value})
    assert same(evaluate("fromJSON(toJSON(v))", env), _as_floats(value))
    assert evaluate("toJSON(fromJSON(toJSON(v)))", env) == evaluate("toJSON(v)", env)


def _as_floats(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list):
        return [_as_floats(v) for v in value]
    return {k: _as_floats(v) for k, v in value.items()}


@SETTINGS
@given(left=json_values, right=json_values)
def test_equality_is_symmetric_and_consistent_with_inequality(left: Any, right: Any) -> None:
    env = EvalEnv(contexts={"l": left, "r": right})
    eq = evaluate("l == r", env)
    assert eq is evaluate("r == l", env)
    assert evaluate("l != r", env) is (not eq)
    assert evaluate("l >= r", env) is (eq or evaluate("l > r", env))
    assert not (evaluate("l < r", env) and evaluate("l > r", env))
