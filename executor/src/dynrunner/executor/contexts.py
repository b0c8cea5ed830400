"""The expression contexts of a job and the environment every step starts from.

What a Gitea runner gives a job (act_runner `runner.go` and act's `withGithubEnv`), here
from the assignment: `github`/`gitea` is Gitea's task context with the workspace, event
file and server URLs of this environment; `needs` the outputs and results Gitea sent;
`vars` and `secrets` the task's; `matrix` and `strategy` the one combination Gitea
expanded; `inputs` the `workflow_dispatch` inputs typed by the workflow's declaration;
`runner` this environment; `job`, `steps` and `env` change while the job runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynrunner.executor.workflow import Strategy
from dynrunner.proto.gitea import Need

RUNNER_OS = "Linux"
_ARCH = {"x86_64": "X64", "amd64": "X64", "aarch64": "ARM64", "arm64": "ARM64", "i386": "X86", "i686": "X86"}
_SECRET_CONTEXT_KEYS = ("gitea_runtime_token", "actions_id_token_request_token")


def runner_arch(machine: str | None = None) -> str:
    machine = (machine or os.uname().machine).lower()
    if machine.startswith("arm") and machine not in _ARCH:
        return "ARM"
    return _ARCH.get(machine, machine.upper())


def reads_true(value: str | None) -> bool:
    """A setting given as text (a secret, a variable, an env var) is on only when it reads `true`."""
    return (value or "").strip().lower() == "true"


@dataclass(frozen=True, slots=True)
class Environment:
    """Where this job runs: the paths and names the contexts and variables point at."""

    gitea_url: str
    runner_name: str
    workspace: Path
    temp_dir: Path
    tool_cache: Path
    event_path: Path
    version: str


def debug_flags(secrets: Mapping[str, str], variables: Mapping[str, str]) -> tuple[bool, bool]:
    """(step debug, runner debug) as GitHub reads them from secrets or variables."""

    def flag(name: str) -> bool:
        return reads_true(secrets.get(name)) or reads_true(variables.get(name))

    step = flag("ACTIONS_STEP_DEBUG")
    return step, step or flag("ACTIONS_RUNNER_DEBUG")


def github_context(task_context: Mapping[str, Any] | None, where: Environment, job_key: str) -> dict[str, Any]:
    """Gitea's `github` context for this environment. The runtime token stays out of it (it
    reaches steps as ACTIONS_RUNTIME_TOKEN); `token` stays, as on GitHub."""
    github = {k: v for k, v in (task_context or {}).items() if k not in _SECRET_CONTEXT_KEYS}
    base = where.gitea_url.rstrip("/")
    for key in ("action", "action_path", "action_ref", "action_repository", "action_status", "path", "env"):
        github.setdefault(key, "")
    github.update(
        workspace=str(where.workspace),
        event_path=str(where.event_path),
        job=github.get("job") or job_key,
        server_url=base,
        api_url=f"{base}/api/v1",
        graphql_url="",
    )
    github.setdefault("event", {})
    return github


def write_event_file(github: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(github.get("event") or {}, indent=2), encoding="utf-8")


def runner_context(where: Environment, debug: bool) -> dict[str, Any]:
    context: dict[str, Any] = {
        "name": where.runner_name,
        "os": RUNNER_OS,
        "arch": runner_arch(),
        "temp": str(where.temp_dir),
        "tool_cache": str(where.tool_cache),
        "environment": "self-hosted",
    }
    if debug:
        context["debug"] = "1"
    return context


def needs_context(needs: Mapping[str, Need]) -> dict[str, Any]:
    return {key: {"outputs": dict(need.outputs), "result": need.result.word} for key, need in needs.items()}


def strategy_context(strategy: Strategy | None) -> dict[str, Any]:
    if strategy is None:
        return {"fail-fast": True, "job-index": 0, "job-total": 1, "max-parallel": 1}
    total = strategy.job_total
    return {
        "fail-fast": strategy.fail_fast,
        "job-index": strategy.job_index,
        "job-total": total,
        "max-parallel": strategy.max_parallel if strategy.max_parallel is not None else total,
    }


def runner_env(
    github: Mapping[str, Any], where: Environment, runtime_token: str, debug: bool, id_token_request_token: str = ""
) -> dict[str, str]:
    """The variables a Gitea runner sets for every step (before `env:` layers and files);
    the OIDC request variables only when Gitea sent them (newer servers may)."""

    def g(key: str) -> str:
        value = github.get(key)
        return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)

    base = where.gitea_url.rstrip("/")
    env = {
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKFLOW": g("workflow"),
        "GITHUB_RUN_ID": g("run_id"),
        "GITHUB_RUN_NUMBER": g("run_number"),
        "GITHUB_RUN_ATTEMPT": g("run_attempt"),
        "GITHUB_ACTOR": g("actor"),
        "GITHUB_TRIGGERING_ACTOR": g("triggering_actor"),
        "GITHUB_REPOSITORY": g("repository"),
        "GITHUB_REPOSITORY_OWNER": g("repository_owner"),
        "GITHUB_EVENT_NAME": g("event_name"),
        "GITHUB_EVENT_PATH": str(where.event_path),
        "GITHUB_WORKSPACE": str(where.workspace),
        "GITHUB_SHA": g("sha"),
        "GITHUB_REF": g("ref"),
        "GITHUB_REF_NAME": g("ref_name"),
        "GITHUB_REF_TYPE": g("ref_type"),
        "GITHUB_REF_PROTECTED": g("ref_protected"),
        "GITHUB_JOB": g("job"),
        "GITHUB_BASE_REF": g("base_ref"),
        "GITHUB_HEAD_REF": g("head_ref"),
        "GITHUB_RETENTION_DAYS": g("retention_days"),
        "GITHUB_SERVER_URL": base,
        "GITHUB_API_URL": f"{base}/api/v1",
        "GITHUB_GRAPHQL_URL": "",
        "GITHUB_ACTION_PATH": "",
        "GITHUB_ACTION_REPOSITORY": "",
        "GITHUB_ACTION_REF": "",
        "GITEA_ACTIONS": "true",
        "GITEA_ACTIONS_RUNNER_VERSION": where.version,
        "GITEA_RUN_ID": g("run_id"),
        "RUNNER_NAME": where.runner_name,
        "RUNNER_OS": RUNNER_OS,
        "RUNNER_ARCH": runner_arch(),
        "RUNNER_TEMP": str(where.temp_dir),
        "RUNNER_TOOL_CACHE": str(where.tool_cache),
        "RUNNER_ENVIRONMENT": "self-hosted",
        "RUNNER_WORKSPACE": str(where.workspace.parent),
        "ACTIONS_RUNTIME_URL": f"{base}/api/actions_pipeline/",
        "ACTIONS_RESULTS_URL": base,
        "ACTIONS_RUNTIME_TOKEN": runtime_token,
    }
    if github.get("actions_id_token_request_url"):
        env["ACTIONS_ID_TOKEN_REQUEST_URL"] = str(github["actions_id_token_request_url"])
        env["ACTIONS_ID_TOKEN_REQUEST_TOKEN"] = id_token_request_token
    if debug:
        env["RUNNER_DEBUG"] = "1"
    return env


@dataclass(slots=True)
class StepRecord:
    outcome: str
    conclusion: str
    outputs: dict[str, str] = field(default_factory=dict)

    def as_context(self) -> dict[str, Any]:
        return {"outputs": dict(self.outputs), "outcome": self.outcome, "conclusion": self.conclusion}


@dataclass(slots=True)
class JobContexts:
    """Every context of the job; `env`, `steps` and `status` change as steps run."""

    github: dict[str, Any]
    needs: dict[str, Any]
    vars: dict[str, str]
    secrets: dict[str, str]
    matrix: dict[str, Any]
    strategy: dict[str, Any]
    inputs: dict[str, Any]
    runner: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    steps: dict[str, StepRecord] = field(default_factory=dict)
    status: str = "success"
    container: dict[str, Any] | None = None
    """`job.container` ({id, network}) while a job container runs."""
    services: dict[str, Any] = field(default_factory=dict)
    """`job.services.<id>` ({id, network, ports})."""

    def job(self) -> dict[str, Any]:
        # No `container` for a job without one: GitHub's (and act's) is empty there, and an action
        # that tests `job.container` picks its shell by it.
        job: dict[str, Any] = {"status": self.status, "services": self.services}
        if self.container is not None:
            job["container"] = self.container
        return job

    def values(
        self, *, env: Mapping[str, str] | None = None, github: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """All contexts by name; the evaluator keeps only those allowed where it evaluates."""
        gh = dict(github) if github is not None else self.github
        return {
            "github": gh,
            "gitea": gh,
            "env": dict(self.env if env is None else env),
            "vars": self.vars,
            "secrets": self.secrets,
            "needs": self.needs,
            "steps": {key: record.as_context() for key, record in self.steps.items()},
            "job": self.job(),
            "runner": self.runner,
            "matrix": self.matrix,
            "strategy": self.strategy,
            "inputs": self.inputs,
        }


def process_base_env() -> dict[str, str]:
    """The executor's own environment, minus its internal settings, as the steps' base."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DYNRUNNER_")}
