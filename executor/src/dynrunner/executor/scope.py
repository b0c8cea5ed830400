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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynrunner.executor.contexts import JobContexts, StepRecord
from dynrunner.executor.scopes import WORKFLOW_STEP, StepKeys
from dynrunner.executor.workflow import RunDefaults, Step

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

    @classmethod
    def of_job(cls, job: JobContexts, workspace: Path, defaults: RunDefaults = RunDefaults()) -> Scope:  # noqa: B008
        return cls(job=job, workspace=workspace, github=job.github, defaults=defaults, steps=job.steps)

    @property
    def top(self) -> bool:
        return self.depth == 0

    def row_index(self, step: Step) -> int | None:
        """Where the rows of `step` go: its own range at the top, its caller's range below."""
        return step.index if self.top else self.rows

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
