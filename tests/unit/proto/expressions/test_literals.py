"""Literals and GitHub's number → string formatting.

Expected values from GitHub's "Evaluate expressions" documentation (literals section) and
the runner's rules (numbers are doubles printed with 15 significant digits).
"""

from __future__ import annotations

import math

import pytest

from dynrunner.proto.expressions import ExpressionError, interpolate, to_display_string
from dynrunner.proto.expressions.evaluator import EvalEnv
from tests.fixtures.expressions import ev


def test_documentation_literals() -> None:
    env = EvalEnv()
    assert ev("null") is None
    assert ev("false") is False
    assert ev("true") is True
    assert ev("711") == 711
    assert ev("-9.2") == -9.2
    assert ev("0xff") == 255
    assert ev("-2.99e-2") == pytest.approx(-0.0299)
    assert ev("'It''s open source!'") == "It's open source!"
    assert interpolate("${{ 'It''s open source!' }}", env) == "It's open source!"
    assert interpolate("myExponentialNumber: ${{ -2.99e-2 }}", env) == "myExponentialNumber: -0.0299"


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1", 1.0),
        (".5", 0.5),
        ("-.5", -0.5),
        ("+1", 1.0),
        ("1.", 1.0),
        ("1e2", 100.0),
        ("1E+1", 10.0),
        ("1e-1", 0.1),
        ("0x0", 0.0),
        ("0xfF", 255.0),
        ("0xffffffff", -1.0),  # parsed as a 32-bit two's-complement pattern, as in the runner
        ("0o777", 511.0),
        ("Infinity", math.inf),
        ("-Infinity", -math.inf),
        ("+Infinity", math.inf),
    ],
)
def test_number_forms(expression: str, value: float) -> None:
    assert ev(expression) == value


def test_nan_literal_is_a_number() -> None:
    assert math.isnan(ev("NaN"))


@pytest.mark.parametrize("expression", ["0x01p2", "-Inf", "-0xFF", "0xFZ", "1.2.3", "0X1F", "0x100000000", "1e"])
def test_malformed_numbers_are_unexpected_symbols(expression: str) -> None:
    with pytest.raises(ExpressionError, match=rf"^Unexpected symbol: '{expression}'\. Located at position 1 "):
        ev(expression)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, ""),
        (True, "true"),
        (False, "false"),
        (1.0, "1"),
        (-2.0, "-2"),
        (0.5, "0.5"),
        (-0.0, "0"),
        (123456.789, "123456.789"),
        (0.84551240822557006, "0.84551240822557"),
        (1e15, "1E+15"),
        (123456789012345.0, "123456789012345"),
        (1e-5, "1E-05"),
        (0.0001, "0.0001"),
        (0.1 + 0.2, "0.3"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
        (math.nan, "NaN"),
        (7, "7"),
        ("text", "text"),
        ([1, 2], "Array"),
        ({"a": 1}, "Object"),
    ],
)
def test_display_string(value: object, text: str) -> None:
    assert to_display_string(value) == text


@pytest.mark.parametrize(
    ("expression", "text"),
    [
        ("1.2e2", "120"),
        ("1.2e-2", "0.012"),
        ("0o10", "8"),
        ("-0.0", "0"),
        ("123456.789", "123456.789"),
    ],
)
def test_numbers_in_format(expression: str, text: str) -> None:
    assert ev(f"format('{{0}}', {expression})") == text


def test_string_escapes_only_doubled_quotes() -> None:
    assert ev("'a\\nb'") == "a\\nb"
    assert ev("''''") == "'"
    assert ev("''") == ""


def test_unterminated_string() -> None:
    with pytest.raises(ExpressionError, match=r"^Unexpected symbol: ''foo'\. Located at position 1"):
        ev("'foo")


def test_keywords_are_case_sensitive_literals() -> None:
    with pytest.raises(ExpressionError, match="Unrecognized named-value: 'TRUE'"):
        ev("TRUE")
    assert ev("foo.true", foo={"true": "it's true"}) == "it's true"
