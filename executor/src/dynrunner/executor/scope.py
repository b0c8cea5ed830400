"""Where a step runs: the contexts it is evaluated in and where its results go.

The job's steps run in the job scope; a composite action's steps run in a child scope with
the action's own `inputs`, `steps` context and status (`github.action_status`), the
action's `github.action_path`, no `secrets` (GitHub gives composite actions none), and the
`env:` of the step that called the action layered over the job's env context. A variable a
nested step writes to `$GITHUB_ENV` goes to the job's env context, as on GitHub, so the
following steps at every level see it.

A scope also says where its log rows go: the job scope puts each step's rows in that
step's range of the Gitea log; a child scope puts them in the range of the top-level step
that called the action; post steps write job-level rows ("Complete job").

Evaluating a workflow value where it sits (`Evaluator`): the allowed contexts of that key,
the job's status for the status functions, and the type GitHub expects there. Keys name the
place in the workflow as GitHub's context-availability table does (`jobs.<job_id>.steps.if`,
...); `ALLOWED_CONTEXTS` of the expression engine says which contexts each key may use, so
naming any other context there is an error, as on GitHub.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynrunner.executor.contexts import JobContexts, StepRecord
from dynrunner.executor.workflow import RunDefaults, Step
from dynrunner.proto.expressions import (
    ALLOWED_CONTEXTS,
    EvalEnv,
    ExpressionError,
    HashFiles,
    evaluate_if,
    interpolate,
    interpolate_tree,
    is_single_expression,
    is_truthy,
    to_display_string,
)

WORKFLOW_ENV = "env"
JOB_NAME = "jobs.<job_id>.name"
JOB_IF = "jobs.<job_id>.if"
JOB_ENV = "jobs.<job_id>.env"
JOB_DEFAULTS_RUN = "jobs.<job_id>.defaults.run"
JOB_TIMEOUT = "jobs.<job_id>.timeout-minutes"
JOB_CONTINUE = "jobs.<job_id>.continue-on-error"
JOB_OUTPUTS = "jobs.<job_id>.outputs.<output_id>"
STEP_IF = "jobs.<job_id>.steps.if"
STEP_ENV = "jobs.<job_id>.steps.env"
STEP_NAME = "jobs.<job_id>.steps.name"
STEP_RUN = "jobs.<job_id>.steps.run"
STEP_WITH = "jobs.<job_id>.steps.with"
STEP_WORKING_DIRECTORY = "jobs.<job_id>.steps.working-directory"
STEP_TIMEOUT = "jobs.<job_id>.steps.timeout-minutes"
STEP_CONTINUE = "jobs.<job_id>.steps.continue-on-error"


@dataclass(frozen=True, slots=True)
class StepKeys:
    """The keys of a step's fields at one level: a workflow's steps, or an action's."""

    if_: str
    env: str
    name: str
    run: str
    with_: str
    working_directory: str
    timeout: str
    continue_on_error: str


ACTION_INPUT_DEFAULT = "inputs.<input_id>.default"
ACTION_OUTPUT = "outputs.<output_id>.value"
ACTION_PRE_IF = "runs.pre-if"
ACTION_POST_IF = "runs.post-if"
_ACTION_STEPS = "runs.steps"

WORKFLOW_STEP = StepKeys(
    if_=STEP_IF,
    env=STEP_ENV,
    name=STEP_NAME,
    run=STEP_RUN,
    with_=STEP_WITH,
    working_directory=STEP_WORKING_DIRECTORY,
    timeout=STEP_TIMEOUT,
    continue_on_error=STEP_CONTINUE,
)
ACTION_STEP = StepKeys(
    if_="runs.steps.if",
    env=_ACTION_STEPS,
    name=_ACTION_STEPS,
    run=_ACTION_STEPS,
    with_=_ACTION_STEPS,
    working_directory=_ACTION_STEPS,
    timeout=_ACTION_STEPS,
    continue_on_error=_ACTION_STEPS,
)

MAX_DEPTH = 10
"""Composite actions nest at most this deep (GitHub's limit)."""


@dataclass(frozen=True, slots=True)
class ActionInfo:
    """The action a scope's steps belong to: GITHUB_ACTION_PATH, _REPOSITORY and _REF."""

    path: str = ""
    repository: str = ""
    ref: str = ""

    def variables(self) -> dict[str, str]:
        """GITHUB_ACTION_PATH, _REPOSITORY and _REF ({} outside an action)."""
        if not (self.path or self.repository or self.ref):
            return {}
        return {
            "GITHUB_ACTION_PATH": self.path,
            "GITHUB_ACTION_REPOSITORY": self.repository,
            "GITHUB_ACTION_REF": self.ref,
        }


@dataclass(slots=True)
class Scope:
    job: JobContexts
    workspace: Path
    github: dict[str, Any]
    """The `github` context of this level (a child scope's has the action's path)."""
    keys: StepKeys = WORKFLOW_STEP
    defaults: RunDefaults = field(default_factory=RunDefaults)
    """`defaults.run` for `run:` steps (the job's, evaluated as it started; none in an action)."""
    steps: dict[str, StepRecord] = field(default_factory=dict)
    inputs: Mapping[str, Any] | None = None
    """An action's inputs; None: the job's (`workflow_dispatch`) inputs."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Layered over the job's env context: the `env:` of the step that called the action."""
    secrets: bool = True
    action: ActionInfo = field(default_factory=ActionInfo)
    rows: int | None = None
    """A child scope's log range: the index of the top-level step that called the action."""
    depth: int = 0
    failed: bool = False
    """A child scope: one of its steps failed (the action's status)."""
    cancelled: bool = False
    """A child scope: one of its steps was cancelled (so is the action)."""
    reports: bool = True
    """The job's steps are Gitea's step rows; not for a called workflow's job (Gitea has none)."""

    @classmethod
    def of_job(cls, job: JobContexts, workspace: Path, defaults: RunDefaults = RunDefaults()) -> Scope:  # noqa: B008
        return cls(job=job, workspace=workspace, github=job.github, defaults=defaults, steps=job.steps)

    @property
    def top(self) -> bool:
        return self.depth == 0

    @property
    def step_rows(self) -> bool:
        """Whether this level's steps report their state as Gitea's step rows."""
        return self.top and self.reports

    def row_index(self, step: Step) -> int | None:
        """Where the rows of `step` go: its own range at the top, its caller's range below."""
        return step.index if self.step_rows else self.rows

    def env_context(self) -> dict[str, str]:
        return {**self.job.env, **self.env} if self.env else dict(self.job.env)

    def status(self) -> str:
        """What `success()`, `failure()`, `cancelled()` see: the job's status at the top; in
        an action, the action's own (GitHub's `action_status`) unless the job was cancelled."""
        if self.top or self.job.status == "cancelled":
            return self.job.status
        return "failure" if self.failed else "success"

    def values(
        self, *, env: Mapping[str, str] | None = None, github: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """All contexts by name; the evaluator keeps only those allowed where it evaluates."""
        values = self.job.values(env=self.env_context() if env is None else env, github=github or self.github)
        if not self.top:
            values["steps"] = {key: record.as_context() for key, record in self.steps.items()}
            values["secrets"] = {}
            values["github"] = values["gitea"] = {**values["github"], "action_status": self.status()}
        if self.inputs is not None:
            values["inputs"] = self.inputs
        return values

    def record(self, step: Step, record: StepRecord) -> None:
        """A finished step: into this level's `steps` context (only steps with an id, as on
        GitHub), and a failed conclusion fails the job, or the action."""
        if step.user_id:
            self.steps[step.id] = record
        if record.conclusion == "cancelled" and not self.top:
            self.cancelled = True
        if record.conclusion == "failure":
            if self.top:
                if self.job.status == "success":
                    self.job.status = "failure"
            else:
                self.failed = True

    def child(
        self,
        *,
        keys: StepKeys,
        github: dict[str, Any],
        inputs: Mapping[str, Any],
        env: Mapping[str, str],
        action: ActionInfo,
        rows: int | None,
    ) -> Scope:
        """The scope of a composite action's steps, called by a step of this scope."""
        return Scope(
            job=self.job,
            workspace=self.workspace,
            github=github,
            keys=keys,
            inputs=inputs,
            env=env,
            secrets=False,
            action=action,
            rows=rows,
            depth=self.depth + 1,
        )


def _workspace_hasher(workspace: str) -> HashFiles:
    """`hashFiles()` over the job's workspace; the globbing code loads on first use."""

    def hash_files(args: list[str]) -> str:
        from dynrunner.executor.hashfiles import hash_files as hash_workspace

        return hash_workspace(workspace, args)

    return hash_files


class Evaluator:
    """Evaluates values of one scope (the job's, or a composite action's)."""

    __slots__ = ("hash_files", "scope", "workspace")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.workspace = str(scope.workspace)
        self.hash_files = _workspace_hasher(self.workspace)

    def env(
        self,
        where: str,
        *,
        env: Mapping[str, str] | None = None,
        github: Mapping[str, Any] | None = None,
        status: str | None = None,
    ) -> EvalEnv:
        return EvalEnv(
            self.scope.values(env=env, github=github),
            ALLOWED_CONTEXTS[where],
            status or self.scope.status(),
            hash_files=self.hash_files,
        )

    def text(self, where: str, value: Any, **scope: Any) -> str:
        """A string field: `${{ }}` interpolated; YAML scalars as their text."""
        if value is None:
            return ""
        if not isinstance(value, str):
            return to_display_string(value)
        if "${{" not in value:
            return value
        return interpolate(value, self.env(where, **scope))

    def typed(self, where: str, value: Any, **scope: Any) -> Any:
        """A key whose value is not a string (`continue-on-error`, `timeout-minutes`, ...): a
        whole-value `${{ }}` keeps the expression's type, text mixed with expressions is a
        string, and YAML values stay as written."""
        if isinstance(value, str) and "${{" not in value:
            return value
        return interpolate_tree(value, self.env(where, **scope), keep_types=True)

    def strings(self, where: str, mapping: Mapping[str, Any], **scope: Any) -> dict[str, str]:
        """A mapping of string values (`env:`, `with:`), each interpolated in order."""
        return {key: self.text(where, value, **scope) for key, value in mapping.items()}

    def condition(self, where: str, condition: str, **scope: Any) -> bool:
        """An `if:` (empty means `success()`); raises ExpressionError."""
        return bool(evaluate_if(condition or "success()", self.env(where, **scope)))

    def flag(self, where: str, value: Any, **scope: Any) -> bool:
        """A boolean field such as `continue-on-error`: a whole-value expression counts by
        GitHub's truthiness; literal or mixed text must read `true` or `false`."""
        if isinstance(value, bool) or value is None:
            return bool(value)
        result = self.typed(where, value, **scope)
        if not isinstance(result, str) or is_single_expression(value):
            return is_truthy(result)
        text = result.strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise ExpressionError(f"{where}: expected a boolean, got {text!r}")

    def minutes(self, where: str, value: Any, **scope: Any) -> float | None:
        """A `timeout-minutes` field; None when unset or 0 (no timeout, as GitHub's runner
        reads it). Fractions are honoured: GitHub documents none (its converter truncates,
        act ignores them), and a sub-minute timeout is what short steps and quick tests ask
        for — truncating `0.5` to "no timeout at all" would turn a bound into none. Raises
        ExpressionError for anything but a non-negative number."""
        if value is None or value == "":
            return None
        result = self.typed(where, value, **scope)
        if isinstance(result, str):
            try:
                result = float(result)
            except ValueError:
                raise ExpressionError(f"{where}: expected a number of minutes, got {result!r}") from None
        if isinstance(result, bool) or not isinstance(result, (int, float)) or result < 0 or math.isnan(result):
            raise ExpressionError(f"{where}: expected a number of minutes, got {result!r}")
        return float(result) or None
