"""Runs and jobs: insertion, job status updates, the job emitter, cancellation, `needs`.

Sources: Gitea `services/actions/run.go` `InsertRun` (jobs with needs start blocked, the
others waiting; a waiting job bumps tasks_version), `models/actions/run_job.go`
`UpdateRunJob` (tasks_version bumps, run status follows `AggregateJobStatus`),
`services/actions/job_emitter.go` (blocked → waiting/skipped once all needs are done),
`models/actions/run_job.go` `CancelJobs`, `services/actions/context.go` `FindTaskNeeds`.

The emitter follows the rule Gitea used until it started evaluating `if:` on the server:
all needs succeeded → waiting; otherwise a job without `if:` is skipped and a job with
`if:` becomes waiting so the runner evaluates it (`if: always()` still runs). As in
G-0715 (PR #38100), a need that failed with `continue-on-error: true` counts as succeeded.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynrunner.doubles.gitea import runners as runner_db
from dynrunner.doubles.gitea.jobparser import ParsedWorkflow
from dynrunner.doubles.gitea.profiles import Profile
from dynrunner.doubles.gitea.status import JobState, Status, aggregate_job_status
from dynrunner.doubles.gitea.store import Row, dumps, loads
from dynrunner.doubles.gitea.truncate import ellipsis_display


@dataclass(frozen=True, slots=True)
class NewRun:
    repository: str
    workflow: str | Mapping[str, Any]
    workflow_file: str
    event_name: str
    event_payload: Mapping[str, Any]
    ref: str
    sha: str
    actor: str
    secrets: Mapping[str, str]
    vars: Mapping[str, str]
    is_fork_pull_request: bool = False


def insert_run(conn: sqlite3.Connection, new: NewRun, now: int) -> int:
    """The run row, numbered per repository (`InsertRun` before it parses the workflow, so
    that `github.run_id`/`run_number` are known at parse time)."""
    owner_id, repo_id = runner_db.ensure_repository(conn, new.repository)
    conn.execute("UPDATE repository SET run_index = run_index + 1 WHERE id = ?", (repo_id,))
    index = conn.execute("SELECT run_index FROM repository WHERE id = ?", (repo_id,)).fetchone()["run_index"]
    cur = conn.execute(
        "INSERT INTO run (repo_id, owner_id, title, workflow_id, idx, trigger_user, ref, commit_sha, event, "
        "event_payload, is_fork_pull_request, status, secrets, vars, created, updated) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            repo_id,
            owner_id,
            ellipsis_display(new.workflow_file, 255),
            new.workflow_file,
            index,
            new.actor,
            new.ref,
            new.sha,
            new.event_name,
            json.dumps(new.event_payload),
            int(new.is_fork_pull_request),
            int(Status.WAITING),
            dumps(dict(new.secrets)),
            dumps(dict(new.vars)),
            now,
            now,
        ),
    )
    return int(cur.lastrowid or 0)


def insert_jobs(
    conn: sqlite3.Connection, run_id: int, workflow: ParsedWorkflow, now: int, *, profile: Profile | None = None
) -> None:
    """`InsertRun`'s second half: the title from `run-name` (else the workflow's name), one
    job per parsed job (blocked when it has needs), the run's status, and a tasks_version
    bump when a job is waiting."""
    run = conn.execute("SELECT * FROM run WHERE id = ?", (run_id,)).fetchone()
    title = workflow.run_name or workflow.name or run["workflow_id"]
    states = []
    legacy_names = profile is not None and not profile.run_prefixed_step_names
    for job in workflow.jobs:
        status = Status.BLOCKED if job.needs else Status.WAITING
        states.append(JobState(status, job.continue_on_error))
        conn.execute(
            "INSERT INTO run_job (run_id, repo_id, owner_id, commit_sha, is_fork_pull_request, name, attempt, "
            "workflow_payload, job_id, needs, runs_on, step_names, has_if, continue_on_error, status, created, "
            "updated) VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                run["repo_id"],
                run["owner_id"],
                run["commit_sha"],
                run["is_fork_pull_request"],
                job.name,
                job.payload,
                job.job_id,
                dumps(list(job.needs)),
                dumps(list(job.runs_on)),
                dumps(list(job.legacy_step_names if legacy_names else job.step_names)),
                int(job.has_if),
                int(job.continue_on_error),
                int(status),
                now,
                now,
            ),
        )
    conn.execute(
        "UPDATE run SET title = ?, status = ? WHERE id = ?",
        (ellipsis_display(title, 255), int(aggregate_job_status(states)), run_id),
    )
    if any(s.status is Status.WAITING for s in states):
        runner_db.increase_tasks_version(conn, run["owner_id"], run["repo_id"])


def get_job(conn: sqlite3.Connection, job_id: int) -> Row | None:
    row: Row | None = conn.execute("SELECT * FROM run_job WHERE id = ?", (job_id,)).fetchone()
    return row


def run_jobs(conn: sqlite3.Connection, run_id: int, columns: str = "*") -> list[Row]:
    return list(conn.execute(f"SELECT {columns} FROM run_job WHERE run_id = ? ORDER BY id", (run_id,)))


def update_run_job(
    conn: sqlite3.Connection,
    job_id: int,
    now: int,
    values: Mapping[str, Any],
    where: Mapping[str, Any] | None = None,
    *,
    profile: Profile,
) -> int:
    """`UpdateRunJob`: update the row (and `updated`); on a status change bump tasks_version
    when the job became waiting, or (main) finished while waiting work remains in its
    repository, and recompute the run's status."""
    sets = ", ".join(f"{k} = ?" for k in values)
    conds = "".join(f" AND {k} = ?" for k in (where or {}))
    cur = conn.execute(
        f"UPDATE run_job SET {sets}, updated = ? WHERE id = ?{conds}",
        (*values.values(), now, job_id, *(where or {}).values()),
    )
    affected = cur.rowcount
    if affected == 0 or "status" not in values:
        return affected
    job = get_job(conn, job_id)
    assert job is not None
    status = Status(job["status"])
    finished_before_waiting = (
        profile.bump_when_job_finishes and status.is_done() and _has_waiting_jobs(conn, job["repo_id"])
    )
    if status is Status.WAITING or finished_before_waiting:
        runner_db.increase_tasks_version(conn, job["owner_id"], job["repo_id"])
    refresh_run_status(conn, job["run_id"], now)
    return affected


def _has_waiting_jobs(conn: sqlite3.Connection, repo_id: int) -> bool:
    row = conn.execute(
        "SELECT 1 FROM run_job WHERE repo_id = ? AND task_id = 0 AND status = ? LIMIT 1", (repo_id, int(Status.WAITING))
    ).fetchone()
    return row is not None


def refresh_run_status(conn: sqlite3.Connection, run_id: int, now: int) -> Status:
    # aggregation only asks "all ..." and "any ...", so distinct (status, flag) pairs suffice
    kinds = conn.execute(
        "SELECT DISTINCT status, continue_on_error FROM run_job WHERE run_id = ?", (run_id,)
    ).fetchall()
    status = aggregate_job_status(JobState(Status(k["status"]), bool(k["continue_on_error"])) for k in kinds)
    run = conn.execute("SELECT started, stopped FROM run WHERE id = ?", (run_id,)).fetchone()
    started = run["started"] or (now if status is Status.RUNNING else 0)
    stopped = run["stopped"] or (now if status.is_done() else 0)
    conn.execute(
        "UPDATE run SET status = ?, started = ?, stopped = ?, updated = ? WHERE id = ?",
        (int(status), started, stopped, now, run_id),
    )
    return status


def abandoned_jobs(conn: sqlite3.Connection, updated_before: int) -> list[Row]:
    return list(
        conn.execute(
            "SELECT * FROM run_job WHERE status IN (?, ?) AND updated < ? ORDER BY id",
            (int(Status.WAITING), int(Status.BLOCKED), updated_before),
        )
    )


# -- the job emitter -----------------------------------------------------------------


def resolve_blocked(jobs: Sequence[Mapping[str, Any]]) -> dict[int, Status]:
    """The emitter's pure core: new statuses for blocked jobs, cascading until stable.

    `jobs` items need `id`, `job_id`, `status`, `needs` (list), `has_if`, and may carry
    `continue_on_error` (a failure of such a need counts as success, `resolveCheckNeeds`).
    """
    statuses = {int(j["id"]): Status(j["status"]) for j in jobs}
    by_key: dict[str, list[int]] = {}
    for j in jobs:
        by_key.setdefault(str(j["job_id"]), []).append(int(j["id"]))
    needs = {int(j["id"]): [n for key in j["needs"] for n in by_key.get(key, [])] for j in jobs}
    has_if = {int(j["id"]): bool(j["has_if"]) for j in jobs}
    continued = {int(j["id"]) for j in jobs if j.get("continue_on_error")}
    changed: dict[int, Status] = {}
    for _ in range(len(statuses)):
        updates: dict[int, Status] = {}
        for job_id, status in statuses.items():
            if status is not Status.BLOCKED:
                continue
            need_statuses = [(n, statuses[n]) for n in needs[job_id]]
            if not all(s.is_done() for _, s in need_statuses):
                continue
            succeeded = all(
                s not in (Status.FAILURE, Status.CANCELLED, Status.SKIPPED) or (s is Status.FAILURE and n in continued)
                for n, s in need_statuses
            )
            updates[job_id] = Status.WAITING if succeeded or has_if[job_id] else Status.SKIPPED
        if not updates:
            break
        statuses.update(updates)
        changed.update(updates)
    return changed


def emit_jobs(conn: sqlite3.Connection, run_id: int, now: int, *, profile: Profile) -> list[int]:
    """`checkJobsByRunID`: apply `resolve_blocked` to the run's jobs; returns updated job ids."""
    blocked = conn.execute(
        "SELECT 1 FROM run_job WHERE run_id = ? AND status = ? LIMIT 1", (run_id, int(Status.BLOCKED))
    ).fetchone()
    if blocked is None:
        return []
    jobs = [
        {
            "id": j["id"],
            "job_id": j["job_id"],
            "status": j["status"],
            "needs": loads(j["needs"]),
            "has_if": j["has_if"],
            "continue_on_error": j["continue_on_error"],
        }
        for j in run_jobs(conn, run_id, "id, job_id, status, needs, has_if, continue_on_error")
    ]
    updated = []
    for job_id, status in resolve_blocked(jobs).items():
        if update_run_job(conn, job_id, now, {"status": int(status)}, {"status": int(Status.BLOCKED)}, profile=profile):
            updated.append(job_id)
    return updated


# -- needs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskNeed:
    result: Status
    outputs: dict[str, str]


def find_task_needs(conn: sqlite3.Connection, job: Row) -> dict[str, TaskNeed]:
    """`FindTaskNeeds`: per needed job id, matrix siblings' outputs merged and their status
    aggregated. Merging keeps the later sibling's keys, an empty value falling back to the
    earlier sibling's (`mergeTwoOutputs`)."""
    wanted = set(loads(job["needs"]))
    if not wanted:
        return {}
    grouped: dict[str, list[Row]] = {}
    for candidate in run_jobs(conn, job["run_id"], "job_id, status, task_id, continue_on_error"):
        if candidate["job_id"] in wanted:
            grouped.setdefault(candidate["job_id"], []).append(candidate)
    needs = {}
    for key, siblings in grouped.items():
        merged: dict[str, str] = {}
        for sibling in siblings:
            if not Status(sibling["status"]).is_done():
                continue
            outputs = task_outputs(conn, sibling["task_id"]) if sibling["task_id"] else {}
            merged = {k: v or merged.get(k, "") for k, v in outputs.items()} if merged else outputs
        result = aggregate_job_status(JobState(Status(s["status"]), bool(s["continue_on_error"])) for s in siblings)
        needs[key] = TaskNeed(result=result, outputs=merged)
    return needs


def task_outputs(conn: sqlite3.Connection, task_id: int) -> dict[str, str]:
    rows = conn.execute("SELECT output_key, output_value FROM task_output WHERE task_id = ? ORDER BY id", (task_id,))
    return {r["output_key"]: r["output_value"] for r in rows}
