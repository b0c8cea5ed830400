"""`${{ }}` interpolation, whole-value expressions, and `if:` semantics."""

from __future__ import annotations

from typing import Any

import pytest

from dynrunner.proto.expressions import EvalEnv, ExpressionError, evaluate_if, interpolate, interpolate_tree
from dynrunner.proto.expressions.templates import Expr, condition_expression, split_template

CONTEXTS: dict[str, Any] = {
    "github": {"ref": "refs/heads/main", "event_name": "push", "event": {"number": 7}},
    "matrix": {"os": "ubuntu", "node": 20, "include": [1, 2]},
    "steps": {"build": {"outcome": "failure", "conclusion": "success", "outputs": {"x": "y"}}},
    "env": {"DEBUG": "true"},
}


def env(status: str = "success") -> EvalEnv:
    return EvalEnv(contexts=CONTEXTS, job_status=status)


@pytest.mark.parametrize(
    ("text", "result"),
    [
        ("no expressions at all", "no expressions at all"),
        ("echo ${{ matrix.os }}", "echo ubuntu"),
        ("${{ matrix.os }}-${{ matrix.node }}", "ubuntu-20"),
        ("${{matrix.os}}", "ubuntu"),
        ("a ${{ null }} b", "a  b"),
        ("${{ true }} ${{ 1.50 }} ${{ matrix.include }} ${{ github.event }}", "true 1.5 Array Object"),
        ("${{ '}}' }} and ${{ 'it''s' }}", "}} and it's"),
        ("{ and } and {0} stay", "{ and } and {0} stay"),
        ("$${{ 'x' }}", "$x"),
        ("${{ 'a' }}${{ 'b' }}", "ab"),
        ("${{ format('{0}', 'x') }}", "x"),
        ("${{ '${{' }}", "${{"),
    ],
)
def test_interpolate(text: str, result: str) -> None:
    assert interpolate(text, env()) == result


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "echo ${{ matrix.os",
            "The expression is not closed. An unescaped ${{ sequence was found, "
            "but the closing }} sequence was not found.",
        ),
        ("echo ${{ '}} }}", "The expression is not closed."),
        ("echo ${{ }}", "An expression was expected"),
        ("echo ${{ steps. }}", "Unexpected end of expression: '.'. Located at position 6 within expression: steps."),
        ("${{ github.event }}", "A mapping was not expected"),
        ("${{ matrix.include }}", "A sequence was not expected"),
    ],
)
def test_interpolate_errors(text: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        interpolate(text, env())
    assert str(caught.value).startswith(message)


def test_every_expression_is_parsed_before_any_is_evaluated() -> None:
    with pytest.raises(ExpressionError, match="Unrecognized named-value: 'nope'"):
        interpolate("${{ fromJSON('') }} ${{ nope }}", env())


def test_split_template() -> None:
    assert split_template("a ${{ x }} b ${{y}}") == ["a ", Expr("x"), " b ", Expr("y")]
    assert split_template("${{ 'a}}b' }}") == [Expr("'a}}b'")]


def test_interpolate_tree_gives_strings_as_for_env_and_with() -> None:
    value = {
        "NAME": "${{ matrix.os }}",
        "NODE": "${{ matrix.node }}",
        "FLAG": "${{ env.DEBUG == 'true' }}",
        "EMPTY": "${{ null }}",
        "PLAIN": 3,
        "NONE": None,
        "LIST": ["${{ github.ref }}", True],
        "${{ matrix.os }}_KEY": "v",
    }
    assert interpolate_tree(value, env()) == {
        "NAME": "ubuntu",
        "NODE": "20",
        "FLAG": "true",
        "EMPTY": "",
        "PLAIN": "3",
        "NONE": "",
        "LIST": ["refs/heads/main", "true"],
        "ubuntu_KEY": "v",
    }


def test_interpolate_tree_can_keep_types() -> None:
    value = {
        "timeout-minutes": "${{ matrix.node }}",
        "continue-on-error": "${{ github.ref != 'refs/heads/main' }}",
        "matrix": '${{ fromJSON(\'{"os": ["a", "b"]}\') }}',
        "label": "os-${{ matrix.os }}",
        "number": 5,
    }
    assert interpolate_tree(value, env(), keep_types=True) == {
        "timeout-minutes": 20,
        "continue-on-error": False,
        "matrix": {"os": ["a", "b"]},
        "label": "os-ubuntu",
        "number": 5,
    }


@pytest.mark.parametrize(
    ("condition", "status", "result"),
    [
        ("github.ref == 'refs/heads/main'", "success", True),
        ("github.ref == 'refs/heads/main'", "failure", False),  # implicit success() &&
        ("${{ github.ref == 'refs/heads/main' }}", "success", True),
        ("${{ github.event_name == 'pull_request' }}", "success", False),
        ("failure()", "failure", True),
        ("failure()", "success", False),
        ("${{ failure() && steps.build.outcome == 'failure' }}", "failure", True),
        ("always()", "cancelled", True),
        ("cancelled()", "cancelled", True),
        ("!cancelled()", "failure", True),  # a status function anywhere disables the implicit success()
        ("success() || failure()", "failure", True),
        ("contains(github.ref, 'main')", "cancelled", False),
        ("", "success", True),
        ("   ", "failure", False),
        (None, "success", True),
        (True, "success", True),
        (False, "success", False),
        (0, "success", False),
        ("github.event.number", "success", True),  # truthiness, not a boolean
        ("steps.build.outputs.missing", "success", False),
        ("${{ github.ref }} == 'refs/heads/other'", "success", True),  # GitHub's gotcha: a non-empty string
        ("${{ 'steps.build.outputs.x' }}", "success", True),  # a lone string literal is read as the condition
    ],
)
def test_evaluate_if(condition: Any, status: str, result: bool) -> None:
    assert evaluate_if(condition, env(status)) is result


def test_condition_expression() -> None:
    assert condition_expression("${{ a }} == '{x}'") == "format('{0} == ''{{x}}''', a)"
    assert condition_expression("${{ 'a''b' }}") == "a'b"
    assert condition_expression(1.5) == "1.5"


def test_if_errors_name_the_users_expression() -> None:
    with pytest.raises(
        ExpressionError, match=r"^Unexpected symbol: '='\. Located at position 5 within expression: a === b$"
    ):
        evaluate_if("a === b", EvalEnv(contexts={"a": 1, "b": 1}))
