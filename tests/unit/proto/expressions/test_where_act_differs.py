"""Expressions act's evaluator refuses or answers otherwise, with GitHub's answers; the
differential tests against act (`tests/differential`) leave these cases out."""

from __future__ import annotations

import math

from dynrunner.proto.expressions import EvalEnv, evaluate_if, interpolate
from tests.fixtures.expressions import ev


def test_integer_literals_beyond_32_bits_are_numbers() -> None:
    """Numbers are doubles; act's schema refuses such a literal as an out-of-range integer."""
    assert interpolate("${{ 4294967296 }} ${{ 1000000000000000000 }}", EvalEnv()) == "4294967296 1E+18"


def test_values_act_fails_to_compute() -> None:
    assert ev("fromJSON('1e400')") == math.inf  # act: "cannot unmarshal number 1e400"
    assert ev("fromJSON('[]') == fromJSON('[]')") is False  # act: "Compare not implemented"
    assert ev("0.1 == '.1'") is True  # a string converts as JavaScript's Number() reads it


def test_an_empty_if_means_success() -> None:
    """GitHub's runner reads an empty condition as `success()`; act's schema refuses `if: ''`."""
    assert evaluate_if("", EvalEnv(job_status="success")) is True
    assert evaluate_if("", EvalEnv(job_status="failure")) is False


def test_tojson_leaves_html_characters_alone() -> None:
    """Newtonsoft's default escaping, as GitHub's runner serializes; act's Go encoder writes
    `<`, `>` and `&` as `\\u003c`, `\\u003e`, `\\u0026`."""
    assert ev("toJSON('a<b>&c')") == '"a<b>&c"'
