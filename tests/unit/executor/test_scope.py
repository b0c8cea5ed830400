"""Evaluating workflow values where they sit: allowed contexts, status, the type expected there."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynrunner.executor import scope
from dynrunner.executor.contexts import JobContexts, StepRecord
from dynrunner.executor.scope import Evaluator, Scope
from dynrunner.proto.expressions import ExpressionError, is_truthy


@pytest.fixture
def ev(tmp_path: Path) -> Evaluator:
    contexts = JobContexts(
        github={"ref": "refs/heads/main", "event_name": "push"},
        needs={"build": {"outputs": {"v": "7"}, "result": "success"}},
        vars={"LIMIT": "3"},
        secrets={"TOKEN": "s"},
        matrix={"os": "linux"},
        strategy={"job-index": 0},
        inputs={},
        runner={"os": "Linux"},
        env={"MODE": "fast"},
    )
    contexts.steps["a"] = StepRecord("failure", "success", {"x": "1"})
    return Evaluator(Scope.of_job(contexts, tmp_path))


def test_text_and_strings(ev: Evaluator) -> None:
    assert ev.text(scope.STEP_RUN, "plain") == "plain"
    assert ev.text(scope.STEP_RUN, "v=${{ needs.build.outputs.v }} os=${{ matrix.os }}") == "v=7 os=linux"
    assert ev.text(scope.STEP_RUN, 5) == "5" and ev.text(scope.STEP_RUN, None) == ""
    assert ev.strings(scope.STEP_ENV, {"A": "${{ env.MODE }}", "B": "x"}) == {"A": "fast", "B": "x"}
    assert ev.text(scope.STEP_RUN, "${{ env.MODE }}", env={"MODE": "slow"}) == "slow"


def test_condition_uses_the_job_status(ev: Evaluator) -> None:
    assert ev.condition(scope.STEP_IF, "") is True
    assert ev.condition(scope.STEP_IF, "steps.a.outcome == 'failure'") is True
    ev.scope.job.status = "failure"
    assert ev.condition(scope.STEP_IF, "") is False
    assert ev.condition(scope.STEP_IF, "failure()") is True
    assert ev.condition(scope.STEP_IF, "${{ always() }}") is True
    ev.scope.job.status = "cancelled"
    assert ev.condition(scope.STEP_IF, "cancelled()") is True
    assert ev.condition(scope.STEP_IF, "failure()") is False


def test_unavailable_contexts_are_errors(ev: Evaluator) -> None:
    with pytest.raises(ExpressionError):
        ev.condition(scope.STEP_IF, "secrets.TOKEN != ''")
    with pytest.raises(ExpressionError):
        ev.text(scope.WORKFLOW_ENV, "${{ env.MODE }}")
    with pytest.raises(ExpressionError):
        ev.condition(scope.JOB_IF, "steps.a.outcome == 'failure'")
    assert ev.text(scope.JOB_ENV, "${{ secrets.TOKEN }}") == "s"


def test_flags(ev: Evaluator) -> None:
    assert ev.flag(scope.STEP_CONTINUE, True) is True
    assert ev.flag(scope.STEP_CONTINUE, None) is False
    assert ev.flag(scope.STEP_CONTINUE, "${{ matrix.os == 'linux' }}") is True
    assert ev.flag(scope.STEP_CONTINUE, "${{ vars.LIMIT }}") is True  # a non-empty string is truthy
    assert ev.flag(scope.STEP_CONTINUE, "${{ 0 }}") is False
    assert ev.flag(scope.STEP_CONTINUE, "tr${{ 'ue' }}") is True
    with pytest.raises(ExpressionError, match="expected a boolean"):
        ev.flag(scope.STEP_CONTINUE, "maybe")


def test_minutes(ev: Evaluator) -> None:
    assert ev.minutes(scope.STEP_TIMEOUT, None) is None
    assert ev.minutes(scope.STEP_TIMEOUT, 0) is None  # GitHub's runner: no timeout
    # Fractions are honoured (GitHub truncates, act ignores them: a bound must stay a bound).
    assert ev.minutes(scope.STEP_TIMEOUT, 1.5) == 1.5
    assert ev.minutes(scope.STEP_TIMEOUT, 0.5) == 0.5
    assert ev.minutes(scope.STEP_TIMEOUT, "${{ 0.01 }}") == 0.01
    assert ev.minutes(scope.JOB_TIMEOUT, float("inf")) == float("inf")
    assert ev.minutes(scope.STEP_TIMEOUT, "${{ vars.LIMIT }}") == 3.0
    assert ev.minutes(scope.STEP_TIMEOUT, "${{ fromJSON(vars.LIMIT) }}") == 3.0
    for bad in (-1, "soon", "${{ 'soon' }}", True):
        with pytest.raises(ExpressionError):
            ev.minutes(scope.STEP_TIMEOUT, bad)


def test_truthy_is_githubs_coercion() -> None:
    assert [is_truthy(v) for v in (None, False, 0, 0.0, float("nan"), "")] == [False] * 6
    assert [is_truthy(v) for v in (True, 1, -1.5, "0", "false", [], {})] == [True] * 7


def test_expression_ends_at_the_first_closing_braces_outside_a_string(ev: Evaluator) -> None:
    """A whole-value expression is found the way the template reader finds it: `}}` or `${{`
    inside a quoted string belong to the expression (counting `${{` or taking the last `}}`
    misread these)."""
    assert ev.flag(scope.STEP_CONTINUE, "${{ '${{' }}") is True  # a non-empty string, not text to parse
    assert ev.flag(scope.STEP_CONTINUE, "${{ '}}' != '}}' }}") is False
    assert ev.minutes(scope.STEP_TIMEOUT, "${{ startsWith('${{ x }}', '${{') && 2 || 5 }}") == 2.0
    assert ev.minutes(scope.STEP_TIMEOUT, "${{ '}}' == '}}' && 4 || 1 }}") == 4.0
    with pytest.raises(ExpressionError, match="expected a boolean"):
        ev.flag(scope.STEP_CONTINUE, "${{ 'tr' }}ue }}")  # text after the expression: 'true }}'
    assert ev.minutes(scope.STEP_TIMEOUT, "1${{ '}}' == '}}' && 5 || 0 }}") == 15.0  # mixed text is a string


def test_typed_keeps_a_whole_value_type(ev: Evaluator) -> None:
    assert ev.typed(scope.STEP_CONTINUE, "${{ fromJSON('[1, 2]') }}") == [1, 2]
    assert ev.typed(scope.STEP_CONTINUE, "n=${{ 1 }}") == "n=1"
    assert ev.typed(scope.STEP_CONTINUE, 3) == 3 and ev.typed(scope.STEP_CONTINUE, "plain") == "plain"
