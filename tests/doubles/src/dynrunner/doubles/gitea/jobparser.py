"""Workflow → one single-job workflow per job and matrix combination, as Gitea does it.

Follows Gitea's `modules/actions/jobparser/` (`jobparser.go` `Parse`, `model.go`
`SingleWorkflow`/`Job`/`Step`) and act's `model/workflow.go` (`GetMatrixes`, `Needs`,
`RunsOn`):

* jobs keep their order in the file; each job expands to one entry per matrix
  combination, combinations sorted by their name `(v1, v2)` (values of keys in key order);
* a job without `name` is named by its id; with a matrix the name gets ` (v1, v2)`
  appended, unless it contains `${{ }}`, which is then interpolated instead;
* `strategy.matrix` is narrowed to the single combination (`{key: [value]}`, keys sorted);
* `runs-on` and `continue-on-error` are evaluated per combination;
* `needs` is erased from the stored payload (`models/actions/run.go` `InsertRun` calls
  `job.EraseNeeds()`), but kept on the job row;
* fields Gitea's `Job`/`Step` structs do not know are dropped; string-typed fields
  (`timeout-minutes`, step `with`, `outputs`, workflow `env`) are written as strings.

Only the expression subset that matters at parse time is evaluated here (`matrix.*`,
`github.*`, `vars.*`, `inputs.*` references, literals); anything else is left as written.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dynrunner.doubles.gitea.interpolation import evaluate_node, interpolate
from dynrunner.doubles.gitea.yamlio import dump, go_sprint, go_string, go_value, load

_JOB_FIELDS = (
    "name",
    "needs",
    "runs-on",
    "env",
    "if",
    "steps",
    "timeout-minutes",
    "continue-on-error",
    "services",
    "strategy",
    "container",
    "defaults",
    "outputs",
    "uses",
    "with",
    "secrets",
    "concurrency",
    "permissions",
)
_STEP_FIELDS = ("id", "if", "name", "uses", "run", "working-directory", "shell", "env", "with")
_CONTAINER_FIELDS = ("image", "env", "ports", "volumes", "options", "credentials", "cmd")
_MAX_NAME_BYTES = 255


class WorkflowError(ValueError):
    """The workflow cannot be turned into jobs (what Gitea reports as an invalid workflow)."""


@dataclass(frozen=True, slots=True)
class ParsedJob:
    job_id: str
    name: str
    payload: bytes
    needs: tuple[str, ...]
    runs_on: tuple[str, ...]
    step_names: tuple[str, ...]
    has_if: bool
    continue_on_error: bool
    matrix: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ParsedWorkflow:
    name: str
    jobs: tuple[ParsedJob, ...]


def parse_workflow(source: str | Mapping[str, Any], *, context: Mapping[str, Any] | None = None) -> ParsedWorkflow:
    """Parse a workflow (YAML text or an already-built mapping)."""
    text = source if isinstance(source, str) else dump(dict(source))
    try:
        doc = load(text)
    except Exception as exc:  # yaml.YAMLError and constructor errors alike
        raise WorkflowError(f"invalid workflow YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise WorkflowError("a workflow must be a mapping")
    jobs = doc.get("jobs")
    if not isinstance(jobs, dict) or not jobs:
        raise WorkflowError("the workflow has no jobs")
    ctx = {"github": dict((context or {}).get("github", {})), "vars": dict((context or {}).get("vars", {}))}
    ctx["inputs"] = dict((context or {}).get("inputs", {}))
    header = _workflow_header(doc, ctx)
    parsed: list[ParsedJob] = []
    for job_id, job in jobs.items():
        if not isinstance(job, dict):
            raise WorkflowError(f"job {job_id!r} must be a mapping")
        job_id = str(job_id)
        if job.get("uses"):
            raise WorkflowError(
                f"job {job_id!r} calls a reusable workflow ({go_string(job['uses'])}); the Gitea double does not "
                "expand reusable workflows"
            )
        needs = _needs(job.get("needs"))
        for need in needs:
            if need not in jobs:
                raise WorkflowError(f"job {job_id!r} needs {need!r}, which is not a job of this workflow")
        for matrix in sorted(_matrixes(job_id, job), key=_matrix_name):
            parsed.append(_single(job_id, job, matrix, header, needs, ctx))
    return ParsedWorkflow(name=go_string(doc.get("name")) or "", jobs=tuple(parsed))


def _workflow_header(doc: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
    header: dict[str, Any] = {}
    if doc.get("name"):
        header["name"] = go_string(doc["name"])
    if "on" in doc and doc["on"] is not None:
        header["on"] = doc["on"]
    env = doc.get("env")
    if isinstance(env, dict) and env:
        header["env"] = {str(k): go_string(v) for k, v in env.items()}
    header["jobs"] = None
    defaults = _defaults(doc.get("defaults"))
    if defaults:
        header["defaults"] = defaults
    if doc.get("permissions") is not None:
        header["permissions"] = doc["permissions"]
    if doc.get("run-name"):
        header["run-name"] = interpolate(go_string(doc["run-name"]), ctx)
    return header


def _defaults(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("run"), dict):
        return {}
    run = {k: go_string(value["run"][k]) for k in ("shell", "working-directory") if value["run"].get(k)}
    return {"run": run} if run else {}


def _needs(raw: Any) -> tuple[str, ...]:
    """act `Job.Needs`: a scalar is one need, a sequence is all of them."""
    if raw is None:
        return ()
    if isinstance(raw, list):
        return tuple(go_string(v) for v in raw)
    if isinstance(raw, dict):
        return ()
    return (go_string(raw),)


def runs_on_labels(raw: Any) -> tuple[str, ...]:
    """act `Job.RunsOn`: scalar → one label, sequence → all, `{group, labels}` → labels + group."""
    if isinstance(raw, dict):
        labels = list(runs_on_labels(raw.get("labels")))
        if raw.get("group"):
            labels.append(go_string(raw["group"]))
        return tuple(labels)
    if isinstance(raw, list):
        if any(isinstance(v, dict | list) for v in raw):
            return ()
        return tuple(go_string(v) for v in raw)
    if raw is None:
        return ()
    return (go_string(raw),)


def _matrixes(job_id: str, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """act `Job.GetMatrixes`, including its include/exclude rules."""
    strategy = job.get("strategy")
    if not isinstance(strategy, dict) or not isinstance(strategy.get("matrix"), dict):
        return [{}]
    raw = dict(strategy["matrix"])
    if not all(isinstance(v, list) for v in raw.values()):
        return [{}]  # act fails to decode map[string][]any and runs the job once without a matrix
    includes = [i for i in raw.pop("include", []) if isinstance(i, dict)]
    excludes_raw = raw.pop("exclude", [])
    excludes = []
    for exclude in excludes_raw:
        if not isinstance(exclude, dict):
            continue
        for key in exclude:
            if key not in raw:
                raise WorkflowError(
                    f"job {job_id!r}: the workflow is not valid. Matrix exclude key {key!r} does not match any key "
                    "within the matrix"
                )
        excludes.append(exclude)
    combos: list[dict[str, Any]] = []
    if raw and all(raw.values()):
        keys = list(raw)
        for values in itertools.product(*(raw[k] for k in keys)):
            combo = dict(zip(keys, values, strict=True))
            if any(_common_keys_match(combo, ex) for ex in excludes):
                continue
            combos.append(combo)
    extra = []
    for include in includes:
        matched = False
        for combo in combos:
            if all(k not in raw or k not in include or combo[k] == include[k] for k in combo):
                matched = True
                combo.update(include)
        if not matched:
            extra.append(dict(include))
    combos.extend(extra)
    return combos or [{}]


def _common_keys_match(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(k not in b or b[k] == v for k, v in a.items())


def _matrix_name(matrix: Mapping[str, Any]) -> str:
    return "(" + ", ".join(go_sprint(matrix[k]) for k in sorted(matrix)) + ")"


def _single(
    job_id: str,
    job: Mapping[str, Any],
    matrix: dict[str, Any],
    header: Mapping[str, Any],
    needs: tuple[str, ...],
    ctx: Mapping[str, Any],
) -> ParsedJob:
    scope = {**ctx, "matrix": matrix}
    name = go_string(job.get("name")) or job_id
    if matrix:
        name = interpolate(name, scope) if ("${{" in name and "}}" in name) else f"{name} {_matrix_name(matrix)}"
    name = _truncate_bytes(name, _MAX_NAME_BYTES)
    runs_on = evaluate_node(job.get("runs-on"), scope)
    continue_on_error = evaluate_node(job.get("continue-on-error"), scope)
    steps = [s for s in job.get("steps") or [] if isinstance(s, dict)]
    out: dict[str, Any] = {}
    for key in _JOB_FIELDS:
        value = _job_field(key, job, name=name, runs_on=runs_on, coe=continue_on_error, steps=steps, matrix=matrix)
        if value is not None:
            out[key] = value
    document = {k: v for k, v in header.items() if k != "jobs"}
    ordered = {}
    for key in header:
        ordered[key] = {job_id: out} if key == "jobs" else document[key]
    return ParsedJob(
        job_id=job_id,
        name=name,
        payload=dump(ordered).encode(),
        needs=needs,
        runs_on=runs_on_labels(runs_on),
        step_names=tuple(step_display_name(s) for s in steps),
        has_if=bool(go_string(job.get("if")).strip()) if job.get("if") is not None else False,
        continue_on_error=continue_on_error is True or go_string(continue_on_error) == "true",
        matrix=matrix,
    )


def _job_field(
    key: str,
    job: Mapping[str, Any],
    *,
    name: str,
    runs_on: Any,
    coe: Any,
    steps: list[dict[str, Any]],
    matrix: Mapping[str, Any],
) -> Any:
    value = job.get(key)
    match key:
        case "name":
            return name
        case "needs":
            return None  # erased from the payload, see the module docstring
        case "runs-on":
            return runs_on
        case "continue-on-error":
            return coe
        case "steps":
            return [_step(s) for s in steps] or None
        case "timeout-minutes":
            return go_string(value) or None
        case "services":
            if not isinstance(value, dict) or not value:
                return None
            return {str(k): _container(v) for k, v in value.items() if isinstance(v, dict)}
        case "strategy":
            return _strategy(value, matrix)
        case "defaults":
            return _defaults(value) or None
        case "outputs":
            if not isinstance(value, dict) or not value:
                return None
            return {str(k): go_string(v) for k, v in value.items()}
        case "uses":
            return go_string(value) or None
        case "with":
            return dict(value) if isinstance(value, dict) and value else None
    return value


def _step(step: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _STEP_FIELDS:
        value = step.get(key)
        if value is None:
            continue
        if key == "with":
            if isinstance(value, dict) and value:
                out[key] = {str(k): go_string(v) for k, v in value.items()}
        elif key in ("if", "env"):
            out[key] = value
        elif go_string(value):
            out[key] = go_string(value)
    if step.get("continue-on-error") is True:
        out["continue-on-error"] = True
    elif step.get("continue-on-error") is not None and go_string(step["continue-on-error"]) not in ("", "false"):
        out["continue-on-error"] = step["continue-on-error"]
    if go_string(step.get("timeout-minutes")):
        out["timeout-minutes"] = go_string(step["timeout-minutes"])
    return out


def _container(spec: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _CONTAINER_FIELDS:
        value = spec.get(key)
        if value in (None, "", [], {}):
            continue
        if key in ("env", "credentials") and isinstance(value, dict):
            out[key] = {str(k): go_string(v) for k, v in value.items()}
        elif key in ("ports", "volumes", "cmd") and isinstance(value, list):
            out[key] = [go_string(v) for v in value]
        else:
            out[key] = go_string(value)
    return out


def _strategy(value: Any, matrix: Mapping[str, Any]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        for key in ("fail-fast", "max-parallel"):
            if value.get(key) is not None and go_string(value[key]):
                out[key] = go_string(value[key])
    if matrix:
        out["matrix"] = {k: [go_value(matrix[k])] for k in sorted(matrix)}
    return out or None


def step_display_name(step: Mapping[str, Any]) -> str:
    """`makeTaskStepDisplayName`: the name, else "Run " + first line of `run`, or uses/id."""
    name = go_string(step.get("name"))
    if not name:
        run = go_string(step.get("run")).strip().split("\n", 1)[0].strip()
        fallback = go_string(step.get("uses")) or go_string(step.get("run")) or go_string(step.get("id"))
        name = "Run " + (run or fallback)
    return name if len(name) <= _MAX_NAME_BYTES else name[: _MAX_NAME_BYTES - 1] + "…"


def _truncate_bytes(text: str, limit: int) -> str:
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[:limit].decode(errors="ignore")
