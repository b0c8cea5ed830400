"""Workflow → one single-job workflow per job and matrix combination, as Gitea does it.

Follows Gitea's `modules/actions/jobparser/` (`jobparser.go` `Parse`, `model.go`
`SingleWorkflow`/`Job`/`Step`/`ContainerSpec`) and act's `model/workflow.go` in the Gitea
runner v1.0.8 that Gitea builds with (`GetMatrixes`, `Matrix`, `Needs`, `RunsOnFromNode`):

* jobs keep their order in the file; each job expands to one entry per matrix
  combination, combinations sorted by their name `(v1, v2)` (values of keys in key order);
* a job without `name` is named by its id; with a matrix the name gets ` (v1, v2)`
  appended, unless it contains `${{ }}`, which is then interpolated instead;
* `strategy.matrix` is narrowed to the single combination (`{key: [value]}`);
* `runs-on` is flattened to labels (`{group, labels}` → labels + group), each label
  interpolated, and written back as one string when there is one label, else a list;
* `continue-on-error` is evaluated per combination;
* `needs` is erased from the stored payload (`services/actions/run.go` `InsertRun` calls
  `job.EraseNeeds()`), but kept on the job row; needs naming no job are accepted (the job
  then only waits for the others);
* a job calling a reusable workflow (`uses`, `with`, `secrets`, no steps) is kept as written:
  Gitea 1.24–1.26 do not expand it, the runner runs the called workflow inside this one job's
  task, and any runner may claim it (`runs-on: []`, no labels to match);
* fields Gitea's structs do not know are dropped; fields they decode into Go strings
  (`timeout-minutes`, step `with` values, `outputs`, workflow `env`, ...) are written as
  the text as written, and a mapping or list where Gitea wants a string, or a step
  `continue-on-error` that is not a boolean, makes the workflow invalid, as in Gitea;
* Go maps (workflow `env`, `services`, `outputs`, `with`, the matrix) are written in
  go-yaml's key order, raw nodes (`on`, job and step `env`, `if`, `container`, ...) as written.

Only the expression subset that matters at parse time is evaluated here (`matrix.*`,
`github.*`, `vars.*`, `inputs.*` references, literals); anything else is left as written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynrunner.doubles.gitea.interpolation import evaluate_node, interpolate
from dynrunner.doubles.gitea.truncate import ellipsis_display
from dynrunner.doubles.gitea.yamlio import dump, go_sorted, go_sprint, go_string, go_value, load

_STEP_STRINGS = ("id", "name", "uses", "run", "working-directory", "shell")
_CONTAINER_FIELDS = ("image", "env", "ports", "volumes", "options", "credentials", "cmd")
_MAX_NAME = 255
# go-yaml decodes these YAML 1.1 spellings into a Go bool as well
_YAML11_TRUE = frozenset(["y", "Y", "yes", "Yes", "YES", "on", "On", "ON"])
_YAML11_FALSE = frozenset(["n", "N", "no", "No", "NO", "off", "Off", "OFF"])


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
    legacy_step_names: tuple[str, ...] = ()
    """The step names of Gitea 1.24 and 1.25 (`legacy_step_display_name`)."""


@dataclass(frozen=True, slots=True)
class ParsedWorkflow:
    name: str
    run_name: str
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
    ctx = {
        "github": dict((context or {}).get("github", {})),
        "vars": dict((context or {}).get("vars", {})),
        "inputs": dict((context or {}).get("inputs", {})),
    }
    header = _workflow_header(doc, ctx)
    parsed: list[ParsedJob] = []
    for job_id, job in jobs.items():
        job_id = str(job_id)
        if job is None:
            raise WorkflowError(f"needed job not found: {job_id!r}")
        if not isinstance(job, dict):
            raise WorkflowError(f"invalid jobs: job {job_id!r} must be a mapping")
        needs = _needs(job.get("needs"))
        for matrix in sorted(_matrixes(job_id, job), key=_matrix_name):
            parsed.append(_single(job_id, job, matrix, header, needs, ctx))
    return ParsedWorkflow(
        name=_string(doc.get("name"), "name"), run_name=str(header.get("run-name", "")), jobs=tuple(parsed)
    )


def _string(value: Any, where: str) -> str:
    """A node decoded into a Go `string`: scalars give their text, anything else fails."""
    if isinstance(value, dict | list):
        kind = "!!map" if isinstance(value, dict) else "!!seq"
        raise WorkflowError(f"invalid jobs: yaml: unmarshal errors: cannot unmarshal {kind} into string ({where})")
    return go_string(value)


def _go_map(value: Any, where: str, element: Callable[[Any, str], Any]) -> dict[str, Any] | None:
    """A node decoded into a Go `map[string]T`, in go-yaml's key order (None when empty)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WorkflowError(f"invalid jobs: yaml: unmarshal errors: {where} must be a mapping")
    return go_sorted({str(k): element(v, f"{where}.{k}") for k, v in value.items()}) or None


def _string_map(value: Any, where: str) -> dict[str, str] | None:
    return _go_map(value, where, _string)


def _string_list(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise WorkflowError(f"invalid jobs: yaml: unmarshal errors: {where} must be a sequence")
    return [_string(v, where) for v in value] or None


def _go_bool(value: Any, where: str) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value in _YAML11_TRUE | _YAML11_FALSE:
        return value in _YAML11_TRUE
    raise WorkflowError(
        f"invalid jobs: yaml: unmarshal errors: cannot unmarshal {go_string(value)!r} into bool ({where})"
    )


def _workflow_header(doc: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
    header: dict[str, Any] = {}
    name = _string(doc.get("name"), "name")
    if name:
        header["name"] = name
    if doc.get("on") is not None:
        header["on"] = doc["on"]
    env = _string_map(doc.get("env"), "env")
    if env:
        header["env"] = env
    header["jobs"] = None
    defaults = _defaults(doc.get("defaults"), "defaults")
    if defaults:
        header["defaults"] = defaults
    if doc.get("permissions") is not None:
        header["permissions"] = doc["permissions"]
    run_name = _string(doc.get("run-name"), "run-name")
    if run_name:
        header["run-name"] = interpolate(run_name, ctx)
    return header


def _defaults(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("run"), dict):
        return {}
    run = value["run"]
    fields = {k: _string(run.get(k), f"{where}.run.{k}") for k in ("shell", "working-directory")}
    fields = {k: v for k, v in fields.items() if v}
    return {"run": fields} if fields else {}


def _needs(raw: Any) -> tuple[str, ...]:
    """act `Job.Needs`: a scalar is one need, a list of scalars all of them, anything else none."""
    if raw is None or isinstance(raw, dict):
        return ()
    if isinstance(raw, list):
        if any(isinstance(v, dict | list) for v in raw):
            return ()
        return tuple(go_string(v) for v in raw)
    return (go_string(raw),)


def runs_on_labels(raw: Any) -> tuple[str, ...]:
    """act `RunsOnFromNode`: scalar → one label, list of scalars → all, `{group, labels}` →
    labels + group; a shape that does not decode gives no labels."""
    if isinstance(raw, dict):
        group = raw.get("group")
        if isinstance(group, dict | list):
            return ()
        labels = list(runs_on_labels(raw.get("labels"))) if not isinstance(raw.get("labels"), dict) else []
        if go_string(group):
            labels.append(go_string(group))
        return tuple(labels)
    if isinstance(raw, list):
        if any(isinstance(v, dict | list) for v in raw):
            return ()
        return tuple(go_string(v) for v in raw)
    if raw is None:
        return ()
    return (go_string(raw),)


def _matrix_values(value: Any) -> list[Any] | None:
    """act's `normalizeMatrixValue`: a list as it is, a scalar as a one-value list, a mapping
    makes the whole matrix invalid (None)."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return None
    return [value]


def _matrixes(job_id: str, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """act `Job.GetMatrixes` (runner v1.0.8), including its include/exclude rules."""
    strategy = job.get("strategy")
    if not isinstance(strategy, dict) or not isinstance(strategy.get("matrix"), dict):
        return [{}]
    matrix: dict[str, list[Any]] = {}
    for key, value in strategy["matrix"].items():
        values = _matrix_values(value)
        if values is None:
            return [{}]  # act logs the invalid matrix and runs the job once without one
        matrix[str(key)] = values
    includes: list[dict[str, Any]] = []
    extra: list[dict[str, Any]] = []
    for entry in matrix.get("include", []):
        for include in entry if isinstance(entry, list) else [entry]:
            if not isinstance(include, dict):
                continue
            # an include naming any matrix key extends combinations, the others are new ones
            (includes if any(k in matrix for k in include) else extra).append(dict(include))
    matrix.pop("include", None)
    excludes = []
    for exclude in matrix.get("exclude", []):
        if not isinstance(exclude, dict):
            continue
        for key in exclude:
            if key not in matrix:
                raise WorkflowError(
                    f"getMatrixes: GetMatrixes: the workflow is not valid. Matrix exclude key {key!r} does not match "
                    f"any key within the matrix (job {job_id!r})"
                )
        excludes.append(exclude)
    matrix.pop("exclude", None)
    combos: list[dict[str, Any]] = []
    if matrix and all(matrix.values()):
        keys = list(matrix)
        for product in itertools.product(*(matrix[k] for k in keys)):
            combo = dict(zip(keys, product, strict=True))
            if not any(_common_keys_match(combo, ex) for ex in excludes):
                combos.append(combo)
    unmatched = []
    for include in includes:
        matched = False
        for combo in combos:
            if all(k not in matrix or k not in include or combo[k] == include[k] for k in combo):
                matched = True
                combo.update(include)
        if not matched:
            unmatched.append(include)
    combos.extend(extra + unmatched)
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
    name = _string(job.get("name"), f"jobs.{job_id}.name") or job_id
    if matrix:
        name = interpolate(name, scope) if ("${{" in name and "}}" in name) else f"{name} {_matrix_name(matrix)}"
    runs_on = tuple(interpolate(label, scope) for label in runs_on_labels(job.get("runs-on")))
    continue_on_error = evaluate_node(job.get("continue-on-error"), scope)
    steps = _steps(job_id, job.get("steps"))
    out: dict[str, Any] = {"name": name, "runs-on": runs_on[0] if len(runs_on) == 1 else list(runs_on)}
    for key in ("env", "if"):
        if job.get(key) is not None:
            out[key] = job[key]
    if steps:
        out["steps"] = [_step(s, f"jobs.{job_id}.steps[{i}]") for i, s in enumerate(steps)]
    timeout = _string(job.get("timeout-minutes"), f"jobs.{job_id}.timeout-minutes")
    if timeout:
        out["timeout-minutes"] = timeout
    if continue_on_error is not None:
        out["continue-on-error"] = continue_on_error
    services = _services(job.get("services"), f"jobs.{job_id}.services")
    if services:
        out["services"] = services
    strategy = _strategy(job.get("strategy"), matrix, f"jobs.{job_id}.strategy")
    if strategy:
        out["strategy"] = strategy
    if job.get("container") is not None:
        out["container"] = job["container"]
    defaults = _defaults(job.get("defaults"), f"jobs.{job_id}.defaults")
    if defaults:
        out["defaults"] = defaults
    outputs = _string_map(job.get("outputs"), f"jobs.{job_id}.outputs")
    if outputs:
        out["outputs"] = outputs
    if job.get("uses") is not None:
        out["uses"] = _string(job.get("uses"), f"jobs.{job_id}.uses")
    if isinstance(job.get("with"), dict) and job["with"]:
        out["with"] = go_value(job["with"])
    if job.get("secrets") is not None:
        out["secrets"] = job["secrets"]
    concurrency = _concurrency(job.get("concurrency"), f"jobs.{job_id}.concurrency")
    if concurrency is not None:
        out["concurrency"] = concurrency
    if job.get("permissions") is not None:
        out["permissions"] = job["permissions"]
    document = {key: ({job_id: out} if key == "jobs" else value) for key, value in header.items()}
    if_node = job.get("if")
    return ParsedJob(
        job_id=job_id,
        name=ellipsis_display(name, _MAX_NAME),
        payload=dump(document).encode(),
        needs=needs,
        runs_on=runs_on,
        step_names=tuple(step_display_name(s) for s in steps),
        legacy_step_names=tuple(legacy_step_display_name(s) for s in steps),
        has_if=if_node is not None and not isinstance(if_node, dict | list) and go_string(if_node) != "",
        continue_on_error=_job_continue_on_error(continue_on_error),
        matrix=matrix,
    )


def _job_continue_on_error(value: Any) -> bool:
    """`Job.GetContinueOnError`: the evaluated node decoded into a bool, false when it does not decode."""
    try:
        return _go_bool(value, "continue-on-error")
    except WorkflowError:
        return False


def _steps(job_id: str, raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise WorkflowError(f"invalid jobs: yaml: unmarshal errors: jobs.{job_id}.steps must be a sequence")
    steps = []
    for index, step in enumerate(raw):
        if step is None:
            continue  # `SingleWorkflow.jobs` drops empty steps
        if not isinstance(step, dict):
            raise WorkflowError(f"invalid jobs: yaml: unmarshal errors: jobs.{job_id}.steps[{index}] must be a mapping")
        steps.append(step)
    return steps


def _step(step: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`jobparser.Step` in its field order: id, if, name, uses, run, working-directory,
    shell, env, with, continue-on-error, timeout-minutes."""
    text = {key: _string(step.get(key), f"{where}.{key}") for key in _STEP_STRINGS}
    out: dict[str, Any] = {}
    if text["id"]:
        out["id"] = text["id"]
    if step.get("if") is not None:
        out["if"] = step["if"]
    for key in ("name", "uses", "run", "working-directory", "shell"):
        if text[key]:
            out[key] = text[key]
    if step.get("env") is not None:
        out["env"] = step["env"]
    with_ = _string_map(step.get("with"), f"{where}.with")
    if with_:
        out["with"] = with_
    if _go_bool(step.get("continue-on-error"), f"{where}.continue-on-error"):
        out["continue-on-error"] = True
    timeout = _string(step.get("timeout-minutes"), f"{where}.timeout-minutes")
    if timeout:
        out["timeout-minutes"] = timeout
    return out


def _services(value: Any, where: str) -> dict[str, Any] | None:
    return _go_map(value, where, _container)


def _container(spec: Any, where: str) -> dict[str, Any] | None:
    """`jobparser.ContainerSpec`: image, env, ports, volumes, options, credentials, cmd."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise WorkflowError(f"invalid jobs: yaml: unmarshal errors: {where} must be a mapping")
    out: dict[str, Any] = {}
    for key in _CONTAINER_FIELDS:
        path = f"{where}.{key}"
        if key in ("env", "credentials"):
            value: Any = _string_map(spec.get(key), path)
        elif key in ("ports", "volumes", "cmd"):
            value = _string_list(spec.get(key), path)
        else:
            value = _string(spec.get(key), path) or None
        if value:
            out[key] = value
    return out


def _strategy(value: Any, matrix: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        for key in ("fail-fast", "max-parallel"):
            text = _string(value.get(key), f"{where}.{key}")
            if text:
                out[key] = text
    if matrix:
        out["matrix"] = go_sorted({k: [go_value(v)] for k, v in matrix.items()})
    return out or None


def _concurrency(value: Any, where: str) -> Any:
    """act's `RawConcurrency`: a scalar stays an expression, a mapping keeps `group` and
    `cancel-in-progress` as strings."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return _string(value, where) or None
    out = {k: _string(value.get(k), f"{where}.{k}") for k in ("group", "cancel-in-progress")}
    return {k: v for k, v in out.items() if v}


def legacy_step_display_name(step: Mapping[str, Any]) -> str:
    """Gitea 1.24 and 1.25 (`CreateTaskForRunner`): `EllipsisDisplayString(step.String(), 255)`,
    act's `Step.String()` = the name, else `uses`, else the whole `run` script, else the id.
    Checked against real 1.25.5 (tests/peers): an unnamed `run` step shows its whole script."""
    name = go_string(step.get("name")) or go_string(step.get("uses")) or go_string(step.get("run"))
    return ellipsis_display(name or go_string(step.get("id")), _MAX_NAME)


def step_display_name(step: Mapping[str, Any]) -> str:
    """`makeTaskStepDisplayName`: the name, else "Run " + first line of `run`, or uses/id."""
    name = go_string(step.get("name"))
    if not name:
        run = go_string(step.get("run")).strip().split("\n", 1)[0].strip()
        fallback = go_string(step.get("uses")) or go_string(step.get("run")) or go_string(step.get("id"))
        name = "Run " + (run or fallback)
    return ellipsis_display(name, _MAX_NAME)
