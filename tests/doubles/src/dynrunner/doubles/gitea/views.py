"""Read-only views of the double's state, for tests and the admin API.

Times are Unix seconds as Gitea stores them (0 = not set). Statuses are Gitea's status
words ("waiting", "blocked", "running", "success", ...).
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass
from typing import Any

from dynrunner.doubles.gitea import runners as runner_db
from dynrunner.doubles.gitea import runs, tasks
from dynrunner.doubles.gitea.logs import LogFiles
from dynrunner.doubles.gitea.status import Status
from dynrunner.doubles.gitea.store import Row, loads


@dataclass(frozen=True, slots=True)
class JobView:
    id: int
    run_id: int
    job_id: str
    name: str
    status: str
    task_id: int
    runs_on: list[str]
    needs: list[str]
    attempt: int
    started: int
    stopped: int
    workflow_payload: str


@dataclass(frozen=True, slots=True)
class RunView:
    id: int
    repository: str
    number: int
    title: str
    status: str
    workflow: str
    event: str
    started: int
    stopped: int
    jobs: list[JobView]

    @property
    def done(self) -> bool:
        return Status[self.status.upper()].is_done()


@dataclass(frozen=True, slots=True)
class StepView:
    index: int
    name: str
    status: str
    log_index: int
    log_length: int
    started: int
    stopped: int


@dataclass(frozen=True, slots=True)
class TaskView:
    id: int
    job_id: int
    runner_id: int
    status: str
    result: int
    started: int
    stopped: int
    updated: int
    steps: list[StepView]
    outputs: dict[str, str]
    log_rows: list[str]
    log_times: list[str]
    log_length: int
    log_archived: bool
    log_filename: str
    token: str


@dataclass(frozen=True, slots=True)
class RunnerView:
    id: int
    uuid: str
    name: str
    version: str
    labels: list[str]
    ephemeral: bool
    disabled: bool
    owner_id: int
    repo_id: int
    cancelling_support: bool
    last_online: int
    last_active: int
    status: str
    deleted: bool = False


def job_counts(conn: sqlite3.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) AS n FROM run_job GROUP BY status")
    return {Status(r["status"]).word: int(r["n"]) for r in rows}


def to_dict(view: Any) -> dict[str, Any]:
    data: dict[str, Any] = asdict(view)
    return data


def job_view(row: Row) -> JobView:
    return JobView(
        id=row["id"],
        run_id=row["run_id"],
        job_id=row["job_id"],
        name=row["name"],
        status=Status(row["status"]).word,
        task_id=row["task_id"],
        runs_on=loads(row["runs_on"]),
        needs=loads(row["needs"]),
        attempt=row["attempt"],
        started=row["started"],
        stopped=row["stopped"],
        workflow_payload=bytes(row["workflow_payload"]).decode(),
    )


def run_view(conn: sqlite3.Connection, run_id: int) -> RunView:
    run = conn.execute("SELECT * FROM run WHERE id = ?", (run_id,)).fetchone()
    if run is None:
        raise KeyError(f"run {run_id} does not exist")
    owner, repo = runner_db.repository_names(conn, run["repo_id"])
    return RunView(
        id=run["id"],
        repository=f"{owner}/{repo}",
        number=run["idx"],
        title=run["title"],
        status=Status(run["status"]).word,
        workflow=run["workflow_id"],
        event=run["event"],
        started=run["started"],
        stopped=run["stopped"],
        jobs=[job_view(j) for j in runs.run_jobs(conn, run_id)],
    )


def run_ids(conn: sqlite3.Connection) -> list[int]:
    return [int(r["id"]) for r in conn.execute("SELECT id FROM run ORDER BY id")]


def task_view(conn: sqlite3.Connection, files: LogFiles, task_id: int) -> TaskView:
    task = tasks.get_task(conn, task_id)
    if task is None:
        raise KeyError(f"task {task_id} does not exist")
    rows = files.read(task["log_filename"], bool(task["log_in_storage"]))
    status = Status(task["status"])
    return TaskView(
        id=task["id"],
        job_id=task["job_id"],
        runner_id=task["runner_id"],
        status=status.word,
        result=status.as_result(),
        started=task["started"],
        stopped=task["stopped"],
        updated=task["updated"],
        steps=[
            StepView(
                index=s["idx"],
                name=s["name"],
                status=Status(s["status"]).word,
                log_index=s["log_index"],
                log_length=s["log_length"],
                started=s["started"],
                stopped=s["stopped"],
            )
            for s in tasks.task_steps(conn, task_id)
        ],
        outputs=runs.task_outputs(conn, task_id),
        log_rows=[content for _, content in rows],
        log_times=[stamp for stamp, _ in rows],
        log_length=task["log_length"],
        log_archived=bool(task["log_in_storage"]),
        log_filename=task["log_filename"],
        token=task["token_plain"],
    )


def runner_views(conn: sqlite3.Connection, now: int, *, include_deleted: bool = False) -> list[RunnerView]:
    query = "SELECT * FROM runner" + ("" if include_deleted else " WHERE deleted = 0") + " ORDER BY id"
    return [
        RunnerView(
            id=r["id"],
            uuid=r["uuid"],
            name=r["name"],
            version=r["version"],
            labels=runner_db.runner_labels(r),
            ephemeral=bool(r["ephemeral"]),
            disabled=bool(r["is_disabled"]),
            owner_id=r["owner_id"],
            repo_id=r["repo_id"],
            cancelling_support=bool(r["has_cancelling_support"]),
            last_online=r["last_online"],
            last_active=r["last_active"],
            status=runner_db.runner_status(r, now),
            deleted=bool(r["deleted"]),
        )
        for r in conn.execute(query)
    ]


def tasks_version(conn: sqlite3.Connection, owner_id: int = 0, repo_id: int = 0) -> int:
    return runner_db.get_tasks_version(conn, owner_id, repo_id)
