"""Reading a workflow call: the `uses:` forms, `on.workflow_call`, input typing, secrets,
and the called workflow's job plan (needs order, matrices)."""

from __future__ import annotations

from typing import Any

import pytest

from dynrunner.executor.reusable.calls import (
    CallError,
    CallRef,
    CallSpec,
    InputSpec,
    call_spec,
    parse_call,
    resolve_inputs,
    resolve_secrets,
    typed_input,
)
from dynrunner.executor.reusable.plan import expand_matrix, instances, plan_jobs
from dynrunner.executor.workflow import WorkflowError, load_workflow

SHA = "a" * 40


def test_the_two_forms_of_uses() -> None:
    local = parse_call("./.gitea/workflows/build.yml", repository="me/app", sha=SHA)
    assert local == CallRef("me", "app", ".gitea/workflows/build.yml", SHA, local=True)
    assert str(local) == "./.gitea/workflows/build.yml"
    remote = parse_call("org/ci/.github/workflows/test.yaml@v1.2", repository="me/app", sha=SHA)
    assert remote == CallRef("org", "ci", ".github/workflows/test.yaml", "v1.2", local=False)
    assert remote.key == "org/ci/.github/workflows/test.yaml@v1.2"


@pytest.mark.parametrize(
    ("uses", "message"),
    [
        ("./.gitea/workflows/x.yml@v1", "takes no @ref"),
        ("./ci/x.yml", "directly in .gitea/workflows or .github/workflows"),
        ("./.gitea/workflows/sub/x.yml", "directly in"),
        ("./.gitea/workflows/x.txt", ".yml or .yaml"),
        ("org/ci/.gitea/workflows/x.yml", "expected ./.gitea/workflows"),
        ("https://example.com/org/ci/.gitea/workflows/x.yml@v1", "from this Gitea instance only"),
        ("org/ci/.gitea/workflows/x.yml@-bad", "names no repository and ref"),
        ("org/ci@v1", "expected"),
    ],
)
def test_calls_that_name_no_workflow(uses: str, message: str) -> None:
    with pytest.raises(CallError, match=message.replace(".", r"\.").replace("@", "@")):
        parse_call(uses, repository="me/app", sha=SHA)


@pytest.mark.parametrize("on", ["workflow_call", ["push", "workflow_call"], {"workflow_call": None}])
def test_workflow_call_declared_in_any_form(on: Any) -> None:
    assert call_spec(on, "w") == CallSpec()


def test_the_call_spec_reads_inputs_secrets_and_outputs() -> None:
    spec = call_spec(
        {
            "workflow_call": {
                "inputs": {"a": {"type": "string", "required": True}, "n": {"type": "number", "default": 3}},
                "secrets": {"token": {"required": True}, "other": None},
                "outputs": {"o": {"value": "${{ jobs.j.outputs.o }}"}},
            }
        },
        "w",
    )
    assert spec.inputs == {"a": InputSpec("string", True), "n": InputSpec("number", False, 3)}
    assert spec.secrets == {"TOKEN": True, "OTHER": False}
    assert spec.outputs == {"o": "${{ jobs.j.outputs.o }}"}


@pytest.mark.parametrize(
    ("on", "message"),
    [
        ("push", "does not list `workflow_call`"),
        ({"workflow_call": {"inputs": {"a": {}}}}, "input 'a' must declare `type:`"),
        ({"workflow_call": {"inputs": {"a": {"type": "choice"}}}}, "it has 'choice'"),
        ({"workflow_call": {"outputs": {"o": {"description": "x"}}}}, "must have a `value:`"),
    ],
)
def test_bad_call_specs(on: Any, message: str) -> None:
    with pytest.raises(CallError, match=message):
        call_spec(on, "w")


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("string", "x", "x"),
        ("string", 3, "3"),
        ("string", 1.5, "1.5"),
        ("string", 2.0, "2"),
        ("string", True, "true"),
        ("string", None, ""),
        ("number", 3, 3),
        ("number", 2.5, 2.5),
        ("number", 4.0, 4),
        ("boolean", False, False),
    ],
)
def test_values_of_the_declared_type(kind: str, value: Any, expected: Any) -> None:
    result = typed_input("i", kind, value)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        ("boolean", "true", "is a boolean, but the caller passed the string 'true'"),
        ("boolean", 1, "the number 1"),
        ("number", "3", "is a number, but the caller passed the string '3'"),
        ("number", True, "the boolean true"),
        ("string", {"a": 1}, "an object"),
        ("string", [1], "an array"),
    ],
)
def test_values_of_another_type_are_refused(kind: str, value: Any, message: str) -> None:
    with pytest.raises(CallError, match=message):
        typed_input("i", kind, value)


SPEC = CallSpec(
    inputs={
        "who": InputSpec("string", required=True),
        "n": InputSpec("number", default="${{ 1 }}"),
        "flag": InputSpec("boolean"),
        "text": InputSpec("string"),
    },
    secrets={"TOKEN": True, "EXTRA": False},
)


def test_inputs_given_defaulted_and_zero_valued() -> None:
    seen = []

    def default(key: str, value: Any) -> Any:
        seen.append((key, value))
        return 7

    inputs = resolve_inputs(SPEC, {"who": "me"}, default, "w")
    assert inputs == {"who": "me", "n": 7, "flag": False, "text": ""}
    assert seen == [("n", "${{ 1 }}")]


def test_unknown_and_missing_inputs_are_errors() -> None:
    with pytest.raises(CallError, match="w declares no input 'colour'"):
        resolve_inputs(SPEC, {"who": "me", "colour": "red"}, lambda k, v: v, "w")
    with pytest.raises(CallError, match="w requires the input 'who'"):
        resolve_inputs(SPEC, {}, lambda k, v: v, "w")


CALLER_SECRETS = {"GITHUB_TOKEN": "tok", "GITEA_TOKEN": "tok", "MINE": "m1", "OTHER": "o1"}


def _evaluate(key: str, value: Any) -> str:
    return f"<{value}>"


def test_secrets_inherited_or_mapped_case_insensitively() -> None:
    assert resolve_secrets(SPEC, "inherit", CALLER_SECRETS, _evaluate, "w") == CALLER_SECRETS
    mapped = resolve_secrets(SPEC, {"token": "${{ secrets.MINE }}"}, CALLER_SECRETS, _evaluate, "w")
    assert mapped == {"GITHUB_TOKEN": "tok", "GITEA_TOKEN": "tok", "TOKEN": "<${{ secrets.MINE }}>"}


def test_undeclared_and_missing_secrets_are_errors() -> None:
    with pytest.raises(CallError, match="w declares no secret 'nope'"):
        resolve_secrets(SPEC, {"token": "x", "nope": "y"}, CALLER_SECRETS, _evaluate, "w")
    with pytest.raises(CallError, match="w requires the secret 'TOKEN'"):
        resolve_secrets(SPEC, None, CALLER_SECRETS, _evaluate, "w")
    with pytest.raises(CallError, match="must be a mapping or `inherit`"):
        resolve_secrets(SPEC, ["x"], CALLER_SECRETS, _evaluate, "w")


def test_jobs_are_ordered_by_needs_and_cycles_refused() -> None:
    doc = load_workflow(
        "on: workflow_call\njobs:\n  c: {needs: [a, b], runs-on: x, steps: [run: c]}\n"
        "  b: {needs: a, runs-on: x, steps: [run: b]}\n  a: {runs-on: x, steps: [run: a]}\n"
    )
    assert [job.key for job in plan_jobs(doc, "w")] == ["a", "b", "c"]
    cyclic = load_workflow("jobs:\n  a: {needs: b, steps: [run: a]}\n  b: {needs: a, steps: [run: b]}\n")
    with pytest.raises(WorkflowError, match="the needs of jobs a, b form a cycle"):
        plan_jobs(cyclic, "w")
    with pytest.raises(WorkflowError, match="needs 'z', which is not a job"):
        plan_jobs(load_workflow("jobs:\n  a: {needs: z, steps: [run: a]}\n"), "w")


def test_a_matrix_with_exclude_and_include() -> None:
    matrix = {
        "os": ["linux", "mac"],
        "v": [1, 2],
        "exclude": [{"os": "mac", "v": 1}],
        "include": [{"os": "linux", "extra": "yes"}, {"os": "win", "v": 9}],
    }
    assert expand_matrix(matrix, "j") == [
        {"os": "linux", "v": 1, "extra": "yes"},
        {"os": "linux", "v": 2, "extra": "yes"},
        {"os": "mac", "v": 2},
        {"os": "win", "v": 9},
    ]
    assert expand_matrix(None, "j") == [{}]
    with pytest.raises(WorkflowError, match="leaves no combination"):
        expand_matrix({"os": ["a"], "exclude": [{"os": "a"}]}, "j")


def test_each_combination_is_a_single_job_workflow_like_giteas() -> None:
    doc = load_workflow(
        "on: workflow_call\nenv: {A: '1.10'}\njobs:\n  t:\n    strategy:\n      matrix: ${{ fromJSON(inputs.m) }}\n"
        "    runs-on: x\n    steps: [run: echo]\n"
    )
    [job] = plan_jobs(doc, "w")
    workflows = instances(doc, job, lambda value: {"matrix": {"n": [1, 2]}}, "w")
    assert [w.job.strategy.matrix for w in workflows if w.job.strategy] == [{"n": 1}, {"n": 2}]
    assert [(w.job.strategy.job_index, w.job.strategy.job_total) for w in workflows if w.job.strategy] == [
        (0, 2),
        (1, 2),
    ]
    assert workflows[0].env == {"A": "1.10"}
