"""Operators, precedence, short-circuit values, loose equality and its coercions.

Expected values from GitHub's documentation ("Operators", loose equality table) and the
runner's `EvaluationResult` rules.
"""

from __future__ import annotations

import pytest

from dynrunner.proto.expressions import ExpressionError
from tests.fixtures.expressions import ev


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 && 2", 2),
        ("0 && 2", 0),
        ("'' && 'x'", ""),
        ("null || 'fallback'", "fallback"),
        ("'a' || 'b'", "a"),
        ("false || 0", 0),
        ("1 && 2 && 3 && 0 && 5", 0),
        ("0 || '' || null", None),
        ("!0", True),
        ("!'x'", False),
        ("!!'x'", True),
        ("!fromJSON('[]')", False),
    ],
)
def test_logical_operators_return_operand_values(expression: str, value: object) -> None:
    assert ev(expression) == value


def test_ternary_idiom_from_the_documentation() -> None:
    expression = "github.ref == 'refs/heads/main' && 'value_for_main_branch' || 'value_for_other_branches'"
    assert ev(expression, github={"ref": "refs/heads/main"}) == "value_for_main_branch"
    assert ev(expression, github={"ref": "refs/heads/dev"}) == "value_for_other_branches"


def test_and_or_short_circuit() -> None:
    assert ev("false && fromJSON('')") is False
    assert ev("true || fromJSON('')") is True
    with pytest.raises(ExpressionError, match="Error reading JToken"):
        ev("true && fromJSON('')")


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 == 1 && 2 == 3 || true", True),
        ("true || false && false", True),  # && binds tighter than ||
        ("(true || false) && false", False),
        ("!true == false", True),  # ! binds tighter than ==
        ("1 < 2 == true", True),  # comparisons bind tighter than equality
        ("2 > 1 && 1 >= 1 && 1 <= 1 && 0 < 1", True),
        ("1 == 1 == true", True),
        ("1 && 2 || 3 && 4", 2),
    ],
)
def test_precedence(expression: str, value: object) -> None:
    assert ev(expression) == value


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("null == 0", True),
        ("null == false", True),
        ("null == ''", True),
        ("true == 1", True),
        ("false == 0", True),
        ("true == '1'", True),
        ("'' == 0", True),
        ("' 123456.789 ' == 123456.789", True),
        ("' 0xff ' == 255", True),
        ("' 0o10 ' == 8", True),
        ("' Infinity ' == Infinity", True),
        ("'abc' == 0", False),
        ("'1e3' == 1000", True),
        ("NaN == NaN", False),
        ("NaN != NaN", True),
        ("' NaN ' > NaN", False),
        ("fromJSON('[]') == fromJSON('[]')", False),  # objects and arrays compare by reference
        ("fromJSON('{}') == 0", False),
        ("fromJSON('[]') != NaN", True),
        ("'abc' == 'ABC'", True),
        ("'ABC' != 'abc'", False),
        ("'ç' == 'Ç'", True),
        ("'ı' == 'I'", False),  # no mapping from non-ASCII to ASCII, as .NET OrdinalIgnoreCase
        ("'b' > 'A'", True),
        ("'A' < '['", True),  # letters compare as upper case
        ("'abc' >= 'ABC'", True),
        ("true > false", True),
        ("false < true", True),
        ("'2' > 10", False),
        ("'20' > 10", True),
        ("null < 1", True),
        ("'x' < 'x'", False),
        ("fromJSON('[]') < 1", False),
    ],
)
def test_loose_comparisons(expression: str, value: bool) -> None:
    assert ev(expression) is value


def test_same_object_is_equal_to_itself() -> None:
    obj = {"a": 1}
    assert ev("x == x", x=obj) is True
    assert ev("x == y", x=obj, y={"a": 1}) is False


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 <", "Unexpected end of expression: '<'. Located at position 3 within expression: 1 <"),
        ("> 1", "Unexpected symbol: '>'. Located at position 1 within expression: > 1"),
        ("1 = < 2", "Unexpected symbol: '='. Located at position 3 within expression: 1 = < 2"),
        ("1 & < 2", "Unexpected symbol: '&'. Located at position 3 within expression: 1 & < 2"),
        ("1 |2 |3", "Unexpected symbol: '|2'. Located at position 3 within expression: 1 |2 |3"),
        ("1 2", "Unexpected symbol: '2'. Located at position 3 within expression: 1 2"),
        ("(1)2", "Unexpected symbol: '2'. Located at position 4 within expression: (1)2"),
        (" true ||( false && false", "Unexpected end of expression: 'false'. Located at position 20"),
    ],
)
def test_operator_syntax_errors(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        ev(expression)
    assert str(caught.value).startswith(message)
    assert caught.value.kind == "parse"
