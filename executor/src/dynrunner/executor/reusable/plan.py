"""A called workflow's jobs, in an order that honours `needs`, each matrix expanded.

Gitea expands a workflow into jobs on the server, but a called workflow reaches the runner
whole (inside the one task of the calling job), so the runner expands it, as act does: jobs
in file order, moved after the jobs they need; a need naming no job, or needs that form a
cycle, is an error. A matrix becomes one single-job workflow per combination, the way Gitea
narrows it for a task (`{key: [value]}`, `job-index`, `job-total`): the product of the keys'
values, minus `exclude` entries (matching on the keys they name), plus `include` entries
(added to every combination whose original values they match without overwriting one, else
appended as combinations of their own), as GitHub documents it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dynrunner.executor.workflow import Workflow, WorkflowError, parse_document
from dynrunner.executor.workflow.yaml12 import plain

MAX_COMBINATIONS = 256
"""GitHub's limit of jobs one matrix may generate."""


@dataclass(frozen=True, slots=True)
class PlannedJob:
    key: str
    needs: tuple[str, ...]
    raw: Mapping[str, Any]
    """The job as written (scalars keep their text)."""

    @property
    def has_if(self) -> bool:
        value = plain(self.raw.get("if"))
        return value is not None and value != ""


def plan_jobs(doc: Mapping[str, Any], name: str) -> list[PlannedJob]:
    """The called workflow's jobs, needed jobs first; raises WorkflowError."""
    jobs = doc.get("jobs")
    if not isinstance(jobs, Mapping) or not jobs:
        raise WorkflowError(f"{name} has no jobs")
    planned: dict[str, PlannedJob] = {}
    for key, raw in jobs.items():
        if not isinstance(raw, Mapping):
            raise WorkflowError(f"{name}: jobs.{key} must be a mapping")
        needs = plain(raw.get("needs"))
        needs = (needs,) if isinstance(needs, str) else tuple(needs or ())
        if not all(isinstance(n, str) for n in needs):
            raise WorkflowError(f"{name}: jobs.{key}.needs must be a job id or a list of job ids")
        planned[str(key)] = PlannedJob(str(key), tuple(needs), raw)
    for job in planned.values():
        for need in job.needs:
            if need not in planned:
                raise WorkflowError(f"{name}: job '{job.key}' needs '{need}', which is not a job of the workflow")
    ordered: list[PlannedJob] = []
    placed: set[str] = set()
    while len(ordered) < len(planned):
        ready = [j for j in planned.values() if j.key not in placed and all(n in placed for n in j.needs)]
        if not ready:
            stuck = sorted(k for k in planned if k not in placed)
            raise WorkflowError(f"{name}: the needs of jobs {', '.join(stuck)} form a cycle")
        for job in ready:
            ordered.append(job)
            placed.add(job.key)
    return ordered


def _matches(combination: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    return all(k in combination and combination[k] == v for k, v in entry.items())


def expand_matrix(matrix: Any, where: str) -> list[dict[str, Any]]:
    """The combinations of a `strategy.matrix` (plain values, expressions already evaluated)."""
    if matrix is None:
        return [{}]
    if not isinstance(matrix, Mapping):
        raise WorkflowError(f"{where}.strategy.matrix must be a mapping")
    keys = [k for k in matrix if k not in ("include", "exclude")]
    for key in keys:
        if not isinstance(matrix[key], list):
            raise WorkflowError(f"{where}.strategy.matrix.{key} must be a list")
    combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(matrix[k] for k in keys))]
    if not keys:
        combos = []
    for entry in _entries(matrix.get("exclude"), f"{where}.strategy.matrix.exclude"):
        combos = [c for c in combos if not _matches(c, entry)]
    extra: list[dict[str, Any]] = []
    for entry in _entries(matrix.get("include"), f"{where}.strategy.matrix.include"):
        original = {k: v for k, v in entry.items() if k in keys}
        added = False
        for combo in combos:
            if _matches(combo, original):
                combo.update({k: v for k, v in entry.items() if k not in keys})
                added = True
        if not added:
            extra.append(dict(entry))
    combos += extra
    if not combos:
        raise WorkflowError(f"{where}.strategy.matrix leaves no combination to run")
    if len(combos) > MAX_COMBINATIONS:
        raise WorkflowError(f"{where}.strategy.matrix makes {len(combos)} jobs; at most {MAX_COMBINATIONS} are allowed")
    return combos


def _entries(value: Any, where: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise WorkflowError(f"{where} must be a list of mappings")
    return value


def instances(doc: Mapping[str, Any], job: PlannedJob, evaluate: Callable[[Any], Any], name: str) -> list[Workflow]:
    """One single-job workflow per matrix combination of `job`. `evaluate` turns the written
    `strategy` into values (`jobs.<job_id>.strategy`: `github`, `inputs`, `vars`, `needs`)."""
    where = f"{name}: jobs.{job.key}"
    strategy = job.raw.get("strategy")
    if strategy is not None and not isinstance(strategy, Mapping):
        raise WorkflowError(f"{where}.strategy must be a mapping")
    header = {k: v for k, v in doc.items() if k != "jobs"}
    if not strategy or strategy.get("matrix") is None:
        return [parse_document({**header, "jobs": {job.key: dict(job.raw)}})]
    evaluated = evaluate(plain(strategy))
    if not isinstance(evaluated, Mapping):
        raise WorkflowError(f"{where}.strategy must be a mapping")
    matrix = evaluated.get("matrix")
    combos = expand_matrix(matrix, where)
    out = []
    for index, combo in enumerate(combos):
        narrowed = {
            **evaluated,
            "matrix": {k: [v] for k, v in combo.items()},
            "job-index": index,
            "job-total": len(combos),
        }
        out.append(parse_document({**header, "jobs": {job.key: {**job.raw, "strategy": narrowed}}}))
    return out
