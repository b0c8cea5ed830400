"""Context availability: naming a context or special function not available where the expression sits."""

from __future__ import annotations

from typing import Any

import pytest

from dynrunner.proto.expressions import (
    ALLOWED_CONTEXTS,
    EvalEnv,
    ExpressionError,
    evaluate,
    evaluate_if,
    interpolate,
)

CONTEXTS: dict[str, Any] = {
    "github": {"ref": "refs/heads/main"},
    "gitea": {"ref": "refs/heads/main"},
    "needs": {"build": {"result": "failure", "outputs": {"v": "1"}}},
    "steps": {"s": {"outcome": "success"}},
    "env": {"A": "a"},
    "secrets": {"TOKEN": "t"},
    "matrix": {"os": "linux"},
}


def at(key: str, status: str = "success") -> EvalEnv:
    return EvalEnv(contexts=CONTEXTS, allowed=ALLOWED_CONTEXTS[key], job_status=status)


def test_job_if_sees_needs_but_not_steps() -> None:
    job_if = "jobs.<job_id>.if"
    assert evaluate_if("needs.build.result == 'failure'", at(job_if, "failure")) is False
    assert evaluate_if("always() && needs.build.result == 'failure'", at(job_if, "failure")) is True
    assert evaluate_if("${{ failure() }}", at(job_if, "failure")) is True
    with pytest.raises(ExpressionError) as caught:
        evaluate_if("steps.s.outcome == 'success'", at(job_if))
    assert str(caught.value) == (
        "Unrecognized named-value: 'steps'. Located at position 1 within expression: steps.s.outcome == 'success'"
    )
    for name in ("env", "secrets", "matrix"):
        with pytest.raises(ExpressionError, match=f"Unrecognized named-value: '{name}'"):
            evaluate_if(f"{name}.x", at(job_if))


def test_step_if_sees_steps_env_matrix_but_not_secrets() -> None:
    step_if = "jobs.<job_id>.steps.if"
    assert evaluate_if("steps.s.outcome == 'success' && env.A == 'a' && matrix.os", at(step_if)) is True
    with pytest.raises(ExpressionError, match=r"Unrecognized named-value: 'secrets'\. Located at position 17"):
        evaluate_if("github.ref && !!secrets.TOKEN", at(step_if))


def test_special_functions_only_where_listed() -> None:
    with pytest.raises(
        ExpressionError,
        match=r"^Unrecognized function: 'success'\. Located at position 1 within expression: success\(\)$",
    ):
        interpolate("${{ success() }}", at("jobs.<job_id>.steps.env"))
    with pytest.raises(ExpressionError, match="Unrecognized function: 'hashFiles'"):
        interpolate("${{ hashFiles('x') }}", at("jobs.<job_id>.env"))
    with pytest.raises(ExpressionError, match="Unrecognized function: 'hashFiles'"):
        evaluate_if("hashFiles('x') != ''", at("jobs.<job_id>.if"))
    assert evaluate("toJSON(matrix)", at("jobs.<job_id>.env")) == '{\n  "os": "linux"\n}'


def test_workflow_level_env_sees_secrets_but_not_job_contexts() -> None:
    assert interpolate("${{ secrets.TOKEN }}", at("env")) == "t"
    with pytest.raises(ExpressionError, match="Unrecognized named-value: 'needs'"):
        interpolate("${{ needs.build.outputs.v }}", at("env"))


def test_gitea_is_available_wherever_github_is() -> None:
    for key, names in ALLOWED_CONTEXTS.items():
        assert ("github" in names) == ("gitea" in names), key
    assert interpolate("${{ gitea.ref }}", at("run-name")) == "refs/heads/main"


def test_allowed_but_absent_context_is_null() -> None:
    assert evaluate("inputs.missing", at("jobs.<job_id>.steps.run")) is None


def test_table_matches_the_documentation() -> None:
    step_keys = [k for k in ALLOWED_CONTEXTS if k.startswith("jobs.<job_id>.steps.")]
    assert sorted(step_keys) == sorted(
        f"jobs.<job_id>.steps.{k}"
        for k in ("continue-on-error", "env", "if", "name", "run", "timeout-minutes", "with", "working-directory")
    )
    assert ALLOWED_CONTEXTS["jobs.<job_id>.if"] == {
        "github", "gitea", "needs", "vars", "inputs", "always", "cancelled", "success", "failure"
    }  # fmt: skip
    assert ALLOWED_CONTEXTS["jobs.<job_id>.strategy"] == {"github", "gitea", "needs", "vars", "inputs"}
    assert "secrets" not in ALLOWED_CONTEXTS["jobs.<job_id>.steps.if"]
    assert "hashFiles" in ALLOWED_CONTEXTS["jobs.<job_id>.steps.if"]
    assert "steps" in ALLOWED_CONTEXTS["jobs.<job_id>.outputs.<output_id>"]
    assert "hashFiles" not in ALLOWED_CONTEXTS["jobs.<job_id>.outputs.<output_id>"]


def test_no_allowed_set_means_every_present_context() -> None:
    env = EvalEnv(contexts={"custom": {"x": 1}})
    assert evaluate("custom.x", env) == 1
    with pytest.raises(ExpressionError, match="Unrecognized named-value: 'github'"):
        evaluate("github.ref", env)
