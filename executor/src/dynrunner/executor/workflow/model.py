"""The single-job workflow Gitea hands a runner (`Task.workflow_payload`), as typed values.

Gitea sends the expanded workflow of one job: top-level `name`, `on`, `env`, `defaults`,
`jobs` with exactly one entry, whose `strategy.matrix` is narrowed to one combination
(every key a one-element list) with `job-index`/`job-total` beside it. Expressions are kept
as written; they are evaluated while the job runs, each where GitHub evaluates it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dynrunner.executor.workflow.yaml12 import Scalar, YamlError, as_written, load, plain

STEP_ID_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
AUTO_ID_PREFIX = "__"


class WorkflowError(ValueError):
    """The payload is not a workflow this runner can run; the message says where and why."""


@dataclass(frozen=True, slots=True)
class RunDefaults:
    shell: str | None = None
    working_directory: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One entry of `steps:`. `id` is the user's id or a generated `__<n>` that never
    appears in the `steps` context. `action` is the step's name for `github.action` and
    `GITHUB_ACTION`: the user's id, else the name GitHub generates (`__run`, `__run_2`, ...,
    see `_action_names`). Expression-bearing fields are raw strings."""

    index: int
    id: str
    user_id: bool
    name: str | None
    run: str | None = None
    uses: str | None = None
    shell: str | None = None
    working_directory: str | None = None
    with_: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, Any] = field(default_factory=dict)
    if_: str = ""
    continue_on_error: Any = False
    timeout_minutes: Any = None
    action: str = ""

    @property
    def kind(self) -> str:
        return "run" if self.run is not None else "uses"

    def display_name(self) -> str:
        """The name before expression evaluation: `name:`, else what GitHub derives."""
        if self.name:
            return self.name
        if self.run is not None:
            first = self.run.strip().splitlines()
            return f"Run {first[0] if first else ''}".rstrip()
        return f"Run {self.uses}"


@dataclass(frozen=True, slots=True)
class Strategy:
    matrix: Mapping[str, Any]
    fail_fast: Any = True
    max_parallel: Any = None
    job_index: int = 0
    job_total: int = 1


@dataclass(frozen=True, slots=True)
class Job:
    key: str
    name: str | None
    steps: tuple[Step, ...]
    env: Mapping[str, Any] = field(default_factory=dict)
    defaults: RunDefaults = field(default_factory=RunDefaults)
    outputs: Mapping[str, Any] = field(default_factory=dict)
    timeout_minutes: Any = None
    strategy: Strategy | None = None
    continue_on_error: Any = False
    if_: str = ""
    needs: tuple[str, ...] = ()
    runs_on: Any = None
    container: Any = None
    services: Mapping[str, Any] = field(default_factory=dict)
    uses: str | None = None
    """A reusable workflow this job calls (`jobs.<id>.uses`); then `with_` and `secrets` apply."""
    with_: Mapping[str, Any] = field(default_factory=dict)
    """The call's `with:` values, typed as written (a YAML `true` is a boolean, `1` a number)."""
    secrets: Any = None
    """The call's `secrets:`: None, `inherit`, or a mapping of name → expression."""
    permissions: Any = None
    """The job's `permissions:` as written (None: not given); it replaces the workflow's."""


@dataclass(frozen=True, slots=True)
class Workflow:
    name: str | None
    on: Any
    env: Mapping[str, Any]
    defaults: RunDefaults
    job: Job
    permissions: Any = None
    """The workflow's `permissions:` as written (None: not given)."""


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WorkflowError(f"{where} must be a mapping")
    return value


def _string(value: Any, where: str) -> str | None:
    value = plain(value)
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        raise WorkflowError(f"{where} must be a string")
    return value if isinstance(value, str) else _text(value)


def _text(value: Any) -> str:
    if isinstance(value, Scalar):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _condition(value: Any, where: str) -> str:
    """`if:` as an expression string; YAML booleans and numbers become their literals."""
    if value is None:
        return ""
    if isinstance(value, Scalar):
        value = value.value if isinstance(value.value, str) else value.text
    if isinstance(value, (dict, list)):
        raise WorkflowError(f"{where} must be an expression")
    return value if isinstance(value, str) else _text(value)


def _defaults(value: Any, where: str) -> RunDefaults:
    run = _mapping(_mapping(value, where).get("run"), f"{where}.run")
    unknown = set(run) - {"shell", "working-directory"}
    if unknown:
        raise WorkflowError(f"{where}.run has unknown keys: {', '.join(sorted(unknown))}")
    return RunDefaults(
        shell=_string(run.get("shell"), f"{where}.run.shell"),
        working_directory=_string(run.get("working-directory"), f"{where}.run.working-directory"),
    )


def _env(value: Any, where: str) -> dict[str, Any]:
    """`env:` values as written (strings; expressions are evaluated later)."""
    env = _mapping(value, where)
    out: dict[str, Any] = {}
    for key, item in env.items():
        if isinstance(item, (dict, list)):
            raise WorkflowError(f"{where}.{key} must be a string, number or boolean")
        out[str(key)] = as_written(item)
    return out


_STEP_KEYS = {
    "id",
    "name",
    "run",
    "uses",
    "shell",
    "working-directory",
    "with",
    "env",
    "if",
    "continue-on-error",
    "timeout-minutes",
}


_ACTION_STEP_KEYS = _STEP_KEYS - {"timeout-minutes"}
"""Keys of a composite action's step (actions/runner's action schema: no `timeout-minutes`)."""


def _step(index: int, raw: Any, seen: set[str], *, within: str = "", keys: set[str] = _STEP_KEYS) -> Step:
    where = f"{within}step {index + 1}"
    if not isinstance(raw, dict):
        raise WorkflowError(f"{where} must be a mapping with `run` or `uses`")
    unknown = set(raw) - keys
    if unknown:
        raise WorkflowError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
    run = raw.get("run")
    uses = _string(raw.get("uses"), f"{where}.uses")
    if (run is None) == (uses is None):
        raise WorkflowError(f"{where} must have exactly one of `run` or `uses`")
    user_id = _string(raw.get("id"), f"{where}.id")
    if user_id is not None:
        if not STEP_ID_RE.fullmatch(user_id):
            raise WorkflowError(
                f"{where} has the invalid id {user_id!r}: an id starts with a letter or _ "
                "and contains only letters, digits, - and _"
            )
        if user_id.startswith(AUTO_ID_PREFIX):
            raise WorkflowError(f"{where} has the id {user_id!r}: ids starting with {AUTO_ID_PREFIX} are reserved")
        if user_id.lower() in seen:
            raise WorkflowError(
                f"{where} repeats the step id {user_id!r}; step ids must be unique in a job (ignoring case)"
            )
        seen.add(user_id.lower())
    with_raw = raw.get("with")
    if with_raw is not None and not isinstance(with_raw, dict):
        raise WorkflowError(f"{where}.with must be a mapping")
    return Step(
        index=index,
        id=user_id or f"{AUTO_ID_PREFIX}{index}",
        user_id=user_id is not None,
        name=_string(raw.get("name"), f"{where}.name"),
        run=_run_text(run, f"{where}.run"),
        uses=uses,
        shell=_string(raw.get("shell"), f"{where}.shell"),
        working_directory=_string(raw.get("working-directory"), f"{where}.working-directory"),
        with_=as_written(with_raw or {}),
        env=_env(raw.get("env"), f"{where}.env"),
        if_=_condition(raw.get("if"), f"{where}.if"),
        continue_on_error=plain(raw.get("continue-on-error", False)),
        timeout_minutes=plain(raw.get("timeout-minutes")),
    )


_MAX_NAME = 100  # GitHub's longest node name; a generated one is cut to fit its `_<n>` suffix
_NAME_CHAR_RE = re.compile(r"[^A-Za-z0-9_-]")


def _action_names(steps: tuple[Step, ...], taken: set[str]) -> tuple[Step, ...]:
    """Name each step for `github.action`/`GITHUB_ACTION` as GitHub's workflow converter does:
    a step with an id keeps it; the others, in order, get `__` and what they run (`run` for a
    script, `owner/repo` of an action, `self` for a local one, a docker image), every character
    outside `[A-Za-z0-9_-]` made `_`, and `_2`, `_3`, ... when an earlier step has the name
    (ignoring case): `__run`, `__run_2`, `__actions_checkout`. The ids are taken first, as on
    GitHub, though here none can collide (ids starting with `__` are reserved). Each name's next
    suffix is remembered (`taken` only grows), so naming n steps is linear, not quadratic: a job
    of 20,000 unnamed steps spent ~40 s here before its first step."""
    named = []
    next_attempt: dict[str, int] = {}
    for step in steps:
        if step.user_id:
            named.append(replace(step, action=step.id))
            continue
        base = _NAME_CHAR_RE.sub("_", f"__{_runs_what(step)}")
        attempt = next_attempt.get(base.lower(), 1)
        while True:
            suffix = f"_{attempt}" if attempt > 1 else ""
            candidate = base[: _MAX_NAME - len(suffix)] + suffix
            if candidate.lower() not in taken:
                break
            attempt += 1
        next_attempt[base.lower()] = attempt + 1
        taken.add(candidate.lower())
        named.append(replace(step, action=candidate))
    return tuple(named)


def _runs_what(step: Step) -> str:
    uses = step.uses
    if uses is None:
        return "run"
    if uses.startswith("docker://"):
        return uses.removeprefix("docker://")
    if uses.startswith(("./", ".\\")):
        return "self"
    name = uses.split("://", 1)[-1].split("@", 1)[0]
    return "/".join(name.split("/")[:2]) or "run"


def parse_action_steps(raw: Any, within: str) -> tuple[Step, ...]:
    """`runs.steps` of a composite action (`within` names it in errors, e.g. "action x: ").
    A `run:` step must name its `shell:` (GitHub's schema requires it there)."""
    if not isinstance(raw, list) or not raw:
        raise WorkflowError(f"{within}runs.steps must be a non-empty list")
    seen: set[str] = set()
    parsed = tuple(_step(i, s, seen, within=within, keys=_ACTION_STEP_KEYS) for i, s in enumerate(raw))
    steps = _action_names(parsed, seen)
    for step in steps:
        if step.run is not None and not step.shell:
            raise WorkflowError(f"{within}step {step.index + 1} runs a script without `shell:`, which actions require")
    return steps


def _run_text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        raise WorkflowError(f"{where} must be a string")
    return value.value if isinstance(value, Scalar) and isinstance(value.value, str) else _text(value)


def _strategy(raw: Any) -> Strategy | None:
    if raw is None:
        return None
    strategy = plain(_mapping(raw, "strategy"))
    matrix_raw = strategy.get("matrix")
    matrix: dict[str, Any] = {}
    if matrix_raw is not None:
        if not isinstance(matrix_raw, dict):
            raise WorkflowError("strategy.matrix must be a mapping (Gitea sends one combination per task)")
        for key, values in matrix_raw.items():
            if key in ("include", "exclude"):
                continue
            if not isinstance(values, list) or len(values) != 1:
                raise WorkflowError(
                    f"strategy.matrix.{key} must hold exactly one value: Gitea expands the matrix "
                    "and sends one combination per task"
                )
            matrix[key] = values[0]
    return Strategy(
        matrix=matrix,
        fail_fast=strategy.get("fail-fast", True),
        max_parallel=strategy.get("max-parallel"),
        job_index=_int(strategy.get("job-index", 0), "strategy.job-index"),
        job_total=_int(strategy.get("job-total", 1), "strategy.job-total"),
    )


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkflowError(f"{where} must be an integer")
    return value


def _typed(value: Any) -> Any:
    """A `with:` value of a workflow call: YAML booleans and numbers keep their type (the
    called workflow's input types are checked against them); strings stay as written."""
    if isinstance(value, Scalar):
        return value.text if isinstance(value.value, str) or value.value is None else value.value
    return plain(value)


def _needs(raw: Any) -> tuple[str, ...]:
    value = plain(raw)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise WorkflowError("needs must be a job id or a list of job ids")


def load_workflow(payload: bytes | str) -> dict[str, Any]:
    """A workflow file as a mapping whose scalars keep their text (for `parse_document`)."""
    try:
        doc = load(payload, keep_text=True)
    except YamlError as err:
        raise WorkflowError(f"the workflow is not valid YAML: {err}") from err
    if not isinstance(doc, dict):
        raise WorkflowError("the workflow must be a YAML mapping")
    return doc


def parse_workflow(payload: bytes | str) -> Workflow:
    """Parse Gitea's single-job workflow payload; raises WorkflowError with a readable reason."""
    return parse_document(load_workflow(payload))


def parse_document(doc: Mapping[str, Any]) -> Workflow:
    """A loaded single-job workflow (`load_workflow`) as typed values; raises WorkflowError."""
    jobs = _mapping(doc.get("jobs"), "jobs")
    if len(jobs) != 1:
        raise WorkflowError(f"the workflow must contain exactly one job (Gitea sends one per task), found {len(jobs)}")
    ((key, raw_job),) = jobs.items()
    job_where = f"jobs.{key}"
    job_map = _mapping(raw_job, job_where)
    steps_raw = job_map.get("steps")
    uses = _string(job_map.get("uses"), f"{job_where}.uses")
    if steps_raw is None:
        steps_raw = []
    if not isinstance(steps_raw, list):
        raise WorkflowError(f"{job_where}.steps must be a list")
    seen: set[str] = set()
    steps = _action_names(tuple(_step(i, s, seen) for i, s in enumerate(steps_raw)), seen)
    if not steps and uses is None:
        raise WorkflowError(f"{job_where} has no steps")
    if uses is not None and steps:
        raise WorkflowError(f"{job_where} has both `uses` (a reusable workflow) and `steps`")
    with_raw = job_map.get("with")
    if with_raw is not None and not isinstance(with_raw, dict):
        raise WorkflowError(f"{job_where}.with must be a mapping")
    job = Job(
        key=str(key),
        name=_string(job_map.get("name"), f"{job_where}.name"),
        steps=steps,
        env=_env(job_map.get("env"), f"{job_where}.env"),
        defaults=_defaults(job_map.get("defaults"), f"{job_where}.defaults"),
        outputs={str(k): v for k, v in as_written(_mapping(job_map.get("outputs"), f"{job_where}.outputs")).items()},
        timeout_minutes=plain(job_map.get("timeout-minutes")),
        strategy=_strategy(job_map.get("strategy")),
        continue_on_error=plain(job_map.get("continue-on-error", False)),
        if_=_condition(job_map.get("if"), f"{job_where}.if"),
        needs=_needs(job_map.get("needs")),
        runs_on=plain(job_map.get("runs-on")),
        container=plain(job_map.get("container")),
        services=plain(_mapping(job_map.get("services"), f"{job_where}.services")),
        uses=uses,
        with_={str(k): _typed(v) for k, v in (with_raw or {}).items()},
        secrets=plain(job_map.get("secrets")),
        permissions=plain(job_map.get("permissions")),
    )
    return Workflow(
        name=_string(doc.get("name"), "name"),
        on=plain(doc.get("on")),
        env=_env(doc.get("env"), "env"),
        defaults=_defaults(doc.get("defaults"), "defaults"),
        job=job,
        permissions=plain(doc.get("permissions")),
    )
