"""GitHub's limits and error shapes: depth 50, length 21,000, the memory budget, positions."""

from __future__ import annotations

import pytest

from dynrunner.proto.expressions import EvalEnv, ExpressionError, evaluate, interpolate
from tests.fixtures.expressions import ev


def test_max_depth_counts_tree_levels() -> None:
    assert ev("!" * 49 + "false") is True
    with pytest.raises(ExpressionError) as caught:
        ev("!" * 50 + "false")
    assert str(caught.value) == "Exceeded max expression depth 50"
    path = "foo" + "".join(f"._{i}" for i in range(1, 50))
    assert ev(path, foo={}) is None
    with pytest.raises(ExpressionError, match=r"^Exceeded max expression depth 50$"):
        ev(path + "._50", foo={})


def test_flattened_and_or_do_not_deepen_the_tree() -> None:
    assert ev(" || ".join(str(i) for i in range(1, 61))) == 1
    assert ev(" && ".join(str(i) for i in range(1, 61))) == 60


def test_max_length() -> None:
    long = "'" + "x" * 20998 + "'"
    assert len(ev(long)) == 20998
    with pytest.raises(ExpressionError, match=r"^Exceeded max expression length 21000$"):
        ev(long + " ")


def test_memory_budget() -> None:
    env = EvalEnv(contexts={"big": "x" * 100_000}, max_memory=1024 * 1024)
    assert len(evaluate("format('{0}{0}', big)", env)) == 200_000
    with pytest.raises(ExpressionError) as caught:
        evaluate("format('{0}{0}{0}{0}{0}{0}', big)", env)
    assert str(caught.value) == (
        "The maximum allowed memory size was exceeded while evaluating the following expression: "
        "format('{0}{0}{0}{0}{0}{0}', big)"
    )
    with pytest.raises(ExpressionError, match="maximum allowed memory size was exceeded"):
        evaluate(
            "join(fromJSON(x), big)",
            EvalEnv(contexts={"x": "[1,2,3,4,5,6,7]", "big": "y" * 100_000}, max_memory=1024 * 1024),
        )


def test_memory_is_counted_across_the_tree() -> None:
    env = EvalEnv(contexts={"big": "x" * 200_000}, max_memory=1024 * 1024)
    assert evaluate("startsWith(format('{0}', big), 'x')", env) is True
    with pytest.raises(ExpressionError, match="while evaluating the following expression: startsWith"):
        evaluate("startsWith(format('{0}{0}', big), format('{0}{0}', big))", env)


def test_default_budget_is_the_runners_ten_mebibytes() -> None:
    env = EvalEnv(contexts={"big": "x" * 1_000_000})
    assert len(evaluate("format('{0}{0}{0}{0}', big)", env)) == 4_000_000
    with pytest.raises(ExpressionError, match="maximum allowed memory size"):
        evaluate("format('{0}{0}{0}{0}{0}{0}', big)", env)


def test_positions_count_utf16_units_like_the_runner() -> None:
    with pytest.raises(ExpressionError, match=r"Unexpected symbol: '2'\. Located at position 7 within"):
        ev("'😊x' 2")  # the emoji is two UTF-16 units
    with pytest.raises(ExpressionError, match=r"^Unexpected symbol: '😊'\. Located at position 1"):
        ev("😊 Emoji!! (unicode)")


def test_error_kinds() -> None:
    with pytest.raises(ExpressionError) as parse_error:
        ev("1 +")
    assert parse_error.value.kind == "parse"
    assert parse_error.value.position == 3
    with pytest.raises(ExpressionError) as evaluation_error:
        ev("fromJSON('{')")
    assert evaluation_error.value.kind == "evaluation"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("(1,", "Unexpected symbol: ','. Located at position 3 within expression: (1,"),
        ("endswith(1, 2 a)", "Unexpected symbol: 'a'. Located at position 15"),
        ("foo 2", "Unexpected symbol: '2'. Located at position 5"),
        ("foo['bar']2", "Unexpected symbol: '2'. Located at position 11"),
        ("tojson(1)2", "Unexpected symbol: '2'. Located at position 10"),
        ("..github/workflow.md", "Unexpected symbol: '..github/workflow.md'. Located at position 1"),
        ("github/workflow.md", "Unexpected symbol: 'github/workflow'. Located at position 1"),
        ("toJSON(", "Unexpected end of expression: '('. Located at position 7"),
        ("foo[1", "Unexpected end of expression: '1'. Located at position 5"),
        ("foo.b.", "Unexpected end of expression: '.'. Located at position 6"),
        ("[1]", "Unexpected symbol: '['. Located at position 1"),
        ("foo]", "Unexpected symbol: ']'. Located at position 4"),
        ("foo,github", "Unexpected symbol: ','. Located at position 4"),
        ("fromjson(a,b ", "Unrecognized named-value: 'a'. Located at position 10"),
    ],
)
def test_syntax_errors(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        ev(expression, foo={}, github={})
    assert str(caught.value).startswith(message)


def test_empty_expression_is_null() -> None:
    assert ev("") is None
    assert ev("  \t ") is None
    assert interpolate("plain", EvalEnv()) == "plain"
