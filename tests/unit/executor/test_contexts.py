"""The job's contexts and the environment a Gitea runner gives every step."""

from __future__ import annotations

from pathlib import Path

from dynrunner.executor.contexts import (
    Environment,
    JobContexts,
    StepRecord,
    debug_flags,
    github_context,
    needs_context,
    runner_arch,
    runner_context,
    runner_env,
    strategy_context,
)
from dynrunner.executor.workflow import Strategy
from dynrunner.proto.gitea import Need, Result

WHERE = Environment(
    gitea_url="http://gitea.internal:3000/",
    runner_name="runner-7",
    workspace=Path("/w/workspace/owner/repo"),
    temp_dir=Path("/w/temp"),
    tool_cache=Path("/w/tool-cache"),
    event_path=Path("/w/.dynrunner/event.json"),
    version="1.2.3",
)
TASK_CONTEXT = {
    "repository": "owner/repo",
    "repository_owner": "owner",
    "run_id": "17",
    "run_number": "4",
    "run_attempt": "1",
    "sha": "abc",
    "ref": "refs/heads/main",
    "ref_name": "main",
    "ref_type": "branch",
    "event_name": "push",
    "event": {"head_commit": {"id": "abc"}},
    "actor": "alice",
    "workflow": "ci.yml",
    "job": "build",
    "server_url": "https://gitea.example/",
    "token": "task-token",
    "gitea_runtime_token": "jwt",
    "ref_protected": False,
}


def test_github_context_points_at_this_environment() -> None:
    github = github_context(TASK_CONTEXT, WHERE, "build")
    assert github["workspace"] == "/w/workspace/owner/repo"
    assert github["event_path"] == "/w/.dynrunner/event.json"
    assert github["server_url"] == "http://gitea.internal:3000"
    assert github["api_url"] == "http://gitea.internal:3000/api/v1"
    assert github["graphql_url"] == ""
    assert github["token"] == "task-token"
    assert "gitea_runtime_token" not in github
    assert github["repository"] == "owner/repo" and github["job"] == "build"
    assert github["event"] == {"head_commit": {"id": "abc"}}


def test_runner_env_has_the_gitea_runner_variables() -> None:
    github = github_context(TASK_CONTEXT, WHERE, "build")
    env = runner_env(github, WHERE, "jwt", debug=False)
    expected = {
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITEA_ACTIONS": "true",
        "GITEA_ACTIONS_RUNNER_VERSION": "1.2.3",
        "GITEA_RUN_ID": "17",
        "GITHUB_RUN_ID": "17",
        "GITHUB_RUN_NUMBER": "4",
        "GITHUB_RUN_ATTEMPT": "1",
        "GITHUB_REPOSITORY": "owner/repo",
        "GITHUB_REPOSITORY_OWNER": "owner",
        "GITHUB_SHA": "abc",
        "GITHUB_REF": "refs/heads/main",
        "GITHUB_REF_NAME": "main",
        "GITHUB_REF_TYPE": "branch",
        "GITHUB_REF_PROTECTED": "false",
        "GITHUB_EVENT_NAME": "push",
        "GITHUB_EVENT_PATH": "/w/.dynrunner/event.json",
        "GITHUB_WORKSPACE": "/w/workspace/owner/repo",
        "GITHUB_JOB": "build",
        "GITHUB_ACTOR": "alice",
        "GITHUB_WORKFLOW": "ci.yml",
        "GITHUB_SERVER_URL": "http://gitea.internal:3000",
        "GITHUB_API_URL": "http://gitea.internal:3000/api/v1",
        "GITHUB_GRAPHQL_URL": "",
        "RUNNER_NAME": "runner-7",
        "RUNNER_OS": "Linux",
        "RUNNER_TEMP": "/w/temp",
        "RUNNER_TOOL_CACHE": "/w/tool-cache",
        "RUNNER_ENVIRONMENT": "self-hosted",
        "RUNNER_WORKSPACE": "/w/workspace/owner",
        "ACTIONS_RUNTIME_URL": "http://gitea.internal:3000/api/actions_pipeline/",
        "ACTIONS_RESULTS_URL": "http://gitea.internal:3000",
        "ACTIONS_RUNTIME_TOKEN": "jwt",
    }
    assert {k: env[k] for k in expected} == expected
    assert "RUNNER_DEBUG" not in env
    assert runner_env(github, WHERE, "jwt", debug=True)["RUNNER_DEBUG"] == "1"


def test_oidc_request_variables_only_when_gitea_sends_them() -> None:
    github = github_context({**TASK_CONTEXT, "actions_id_token_request_url": "https://g/oidc"}, WHERE, "build")
    env = runner_env(github, WHERE, "jwt", debug=False, id_token_request_token="oidc-token")
    assert env["ACTIONS_ID_TOKEN_REQUEST_URL"] == "https://g/oidc"
    assert env["ACTIONS_ID_TOKEN_REQUEST_TOKEN"] == "oidc-token"
    assert "ACTIONS_ID_TOKEN_REQUEST_URL" not in runner_env(github_context(TASK_CONTEXT, WHERE, "b"), WHERE, "", False)


def test_runner_context_and_arch() -> None:
    context = runner_context(WHERE, debug=False)
    assert context["name"] == "runner-7" and context["os"] == "Linux" and context["environment"] == "self-hosted"
    assert context["temp"] == "/w/temp" and context["tool_cache"] == "/w/tool-cache" and "debug" not in context
    assert runner_context(WHERE, debug=True)["debug"] == "1"
    assert [runner_arch(m) for m in ("x86_64", "aarch64", "armv7l", "i686")] == ["X64", "ARM64", "ARM", "X86"]


def test_debug_flags_from_secrets_or_vars() -> None:
    assert debug_flags({}, {}) == (False, False)
    assert debug_flags({"ACTIONS_STEP_DEBUG": "true"}, {}) == (True, True)
    assert debug_flags({}, {"ACTIONS_RUNNER_DEBUG": "TRUE"}) == (False, True)


def test_needs_strategy_and_matrix() -> None:
    needs = needs_context({"build": Need(outputs={"v": "1"}, result=Result.FAILURE)})
    assert needs == {"build": {"outputs": {"v": "1"}, "result": "failure"}}
    assert strategy_context(None) == {"fail-fast": True, "job-index": 0, "job-total": 1, "max-parallel": 1}
    strategy = Strategy(matrix={"os": "a"}, fail_fast=False, job_index=2, job_total=4)
    assert strategy_context(strategy) == {"fail-fast": False, "job-index": 2, "job-total": 4, "max-parallel": 4}


def test_job_contexts_values() -> None:
    contexts = JobContexts(
        github={"job": "build"},
        needs={},
        vars={"V": "1"},
        secrets={"S": "2"},
        matrix={"os": "a"},
        strategy={},
        inputs={},
        runner={"os": "Linux"},
        env={"A": "1"},
    )
    contexts.steps["one"] = StepRecord("failure", "success", {"x": "y"})
    contexts.status = "failure"
    values = contexts.values(env={"B": "2"})
    assert values["github"] is values["gitea"]
    assert values["env"] == {"B": "2"}
    assert values["steps"] == {"one": {"outputs": {"x": "y"}, "outcome": "failure", "conclusion": "success"}}
    assert values["job"]["status"] == "failure"
    assert values["vars"] == {"V": "1"} and values["secrets"] == {"S": "2"} and values["matrix"] == {"os": "a"}
