"""Tasks: claiming, releasing, state updates, stopping, outputs, cancellation.

Sources: Gitea `models/actions/task.go` (`CreateTaskForRunner`, `claimJobForRunner`,
`ReleaseTaskForRunner`, `UpdateTask`, `UpdateTaskByState`, `StopTask`, `logFileName`),
`services/actions/task.go` (`PickTask`), `models/actions/task_output.go`,
`models/actions/run_job.go` (`CancelJobs`), `services/actions/clear_tasks.go`
(`StopZombieTasks`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import Any

from dynrunner.doubles.gitea import runners as runner_db
from dynrunner.doubles.gitea import runs
from dynrunner.doubles.gitea.errors import NOT_EXIST, PlainError
from dynrunner.doubles.gitea.profiles import Profile
from dynrunner.doubles.gitea.status import Status
from dynrunner.doubles.gitea.store import Row, Store, loads
from dynrunner.doubles.gitea.tokens import SaltedToken, new_salted_token

MAX_OUTPUT_KEY_BYTES = 255
MAX_OUTPUT_VALUE_BYTES = 1024 * 1024


class RunnerRemoved(Exception):
    """`PickTask`'s "runner has been removed" for an ephemeral runner whose task is done."""


def get_task(conn: sqlite3.Connection, task_id: int) -> Row | None:
    row: Row | None = conn.execute("SELECT * FROM task WHERE id = ?", (task_id,)).fetchone()
    return row


def task_steps(conn: sqlite3.Connection, task_id: int) -> list[Row]:
    return list(conn.execute("SELECT * FROM task_step WHERE task_id = ? ORDER BY idx", (task_id,)))


def log_filename(owner: str, repo: str, task_id: int) -> str:
    return f"{owner}/{repo}/{task_id % 256:02x}/{task_id}.log"


# -- picking -------------------------------------------------------------------------


def check_ephemeral(store: Store, runner: Row, now: int) -> bool:
    """`PickTask`'s ephemeral rule. True: the runner may pick. False: it holds an unfinished
    task. Raises RunnerRemoved (after deleting the runner) when its task is finished."""
    if not runner["ephemeral"]:
        return True
    with store.read() as conn:
        task = conn.execute("SELECT status FROM task WHERE runner_id = ? LIMIT 1", (runner["id"],)).fetchone()
    if task is None:
        return True
    if Status(task["status"]) in (Status.WAITING, Status.RUNNING, Status.BLOCKED, Status.CANCELLING):
        return False
    with store.write() as conn:
        runner_db.delete_runner(conn, runner["id"], now)
    raise RunnerRemoved("runner has been removed")


def create_task_for_runner(
    store: Store, runner: Row, now: Callable[[], int], iterations: int, profile: Profile, pause_s: float = 0.0
) -> Row | None:
    """Scan waiting jobs oldest first `(updated, id)` in the runner's scope (main: 100 per
    page) and claim the first whose `runs-on` the runner's labels cover. A lost race moves on
    to the next candidate on main; before, it ends the pick with no task."""
    labels = runner_db.runner_labels(runner)
    scope, scope_args = "", tuple[int, ...]()
    if runner["repo_id"]:
        scope, scope_args = " AND repo_id = ?", (runner["repo_id"],)
    elif runner["owner_id"]:
        scope, scope_args = " AND owner_id = ?", (runner["owner_id"],)
    page = profile.candidate_page
    limit, limit_args = ("", ()) if page is None else (" LIMIT ?", (page,))
    cursor: tuple[int, int] | None = None
    while True:
        page_cond, page_args = "", tuple[int, ...]()
        if cursor is not None:
            page_cond = " AND (updated > ? OR (updated = ? AND id > ?))"
            page_args = (cursor[0], cursor[0], cursor[1])
        with store.read() as conn:
            jobs = list(
                conn.execute(
                    "SELECT id, updated, runs_on FROM run_job WHERE task_id = 0 AND status = ?"
                    f"{scope}{page_cond} ORDER BY updated, id{limit}",
                    (int(Status.WAITING), *scope_args, *page_args, *limit_args),
                )
            )
        if pause_s and jobs:
            time.sleep(pause_s)  # a test hook: widens the window between the scan and the claim
        for job in jobs:
            if not runner_db.can_match_labels(labels, loads(job["runs_on"])):
                continue
            task = claim(store, runner, job["id"], now(), iterations, profile)
            if task is not None or not profile.next_candidate_on_lost_race:
                return task
        if page is None or len(jobs) < page:
            return None
        cursor = (jobs[-1]["updated"], jobs[-1]["id"])


def _claim(store: Store, runner: Row, job_id: int, now: int, token: SaltedToken, profile: Profile) -> Row | None:
    """`claimJobForRunner`: one transaction; the guarded job update decides the race."""
    with store.write() as conn:
        job = runs.get_job(conn, job_id)
        if job is None:
            return None
        cur = conn.execute(
            "INSERT INTO task (job_id, attempt, runner_id, status, started, repo_id, owner_id, commit_sha, "
            "token_hash, token_salt, token_last_eight, token_plain, created, updated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job_id,
                job["attempt"],
                runner["id"],
                int(Status.RUNNING),
                now,
                job["repo_id"],
                job["owner_id"],
                job["commit_sha"],
                token.hash,
                token.salt,
                token.last_eight,
                token.token,
                now,
                now,
            ),
        )
        task_id = int(cur.lastrowid or 0)
        owner, repo = runner_db.repository_names(conn, job["repo_id"])
        conn.execute("UPDATE task SET log_filename = ? WHERE id = ?", (log_filename(owner, repo, task_id), task_id))
        for index, name in enumerate(loads(job["step_names"])):
            conn.execute(
                "INSERT INTO task_step (task_id, name, idx, status) VALUES (?, ?, ?, ?)",
                (task_id, name, index, int(Status.WAITING)),
            )
        claimed = runs.update_run_job(
            conn,
            job_id,
            now,
            {"task_id": task_id, "status": int(Status.RUNNING), "started": now},
            {"task_id": 0, "status": int(Status.WAITING)},
            profile=profile,
        )
        if claimed != 1:
            raise _LostRace  # rolls the task and its steps back
        return get_task(conn, task_id)


class _LostRace(Exception):
    pass


def claim(store: Store, runner: Row, job_id: int, now: int, iterations: int, profile: Profile) -> Row | None:
    """Claim one candidate, or None when another runner took it first. The task token's
    PBKDF2 is computed outside the write lock, and skipped for a job already seen taken."""
    with store.read() as conn:
        job = runs.get_job(conn, job_id)
    if job is None or job["task_id"] != 0 or job["status"] != Status.WAITING:
        return None
    token = new_salted_token(iterations)
    try:
        return _claim(store, runner, job_id, now, token, profile)
    except _LostRace:
        return None


def release_task(store: Store, task_id: int, now: int, *, profile: Profile) -> None:
    """`ReleaseTaskForRunner`: a claimed but undelivered task goes away, its job waits again."""
    with store.write() as conn:
        task = get_task(conn, task_id)
        if task is None:
            return
        released = runs.update_run_job(
            conn,
            task["job_id"],
            now,
            {"status": int(Status.WAITING), "started": 0, "task_id": 0},
            {"task_id": task_id, "status": int(Status.RUNNING)},
            profile=profile,
        )
        if released != 1:
            return
        conn.execute("DELETE FROM task_step WHERE task_id = ?", (task_id,))
        conn.execute("DELETE FROM task WHERE id = ?", (task_id,))


# -- updating ------------------------------------------------------------------------


def _set_task(conn: sqlite3.Connection, task: Row, now: int, values: Mapping[str, Any]) -> None:
    """`UpdateTask`: write the columns (xorm refreshes `updated`); a finished status deletes
    the task's runner when it is ephemeral."""
    sets = "".join(f"{k} = ?, " for k in values)
    conn.execute(f"UPDATE task SET {sets}updated = ? WHERE id = ?", (*values.values(), now, task["id"]))
    if "status" in values and Status(values["status"]).is_done():
        runner_db.delete_ephemeral_runner(conn, task["runner_id"], now)


def update_task_by_state(
    conn: sqlite3.Connection, runner_id: int, state: Any, now: int, *, stopped_at: int, profile: Profile
) -> Row:
    """`UpdateTaskByState`. `state` is a runner.v1.TaskState; raises PlainError with Gitea's
    text on a missing task or a foreign runner (the handler wraps it as "update task: ...")."""
    task = get_task(conn, state.id)
    if task is None:
        raise PlainError(NOT_EXIST)
    if task["runner_id"] != runner_id:
        raise PlainError("invalid runner for task")
    if Status(task["status"]).is_done():
        return task
    if state.result != 0:
        status = Status.CANCELLED if task["status"] == Status.CANCELLING else Status.from_result(state.result)
        _set_task(conn, task, now, {"status": int(status), "stopped": stopped_at})
        runs.update_run_job(conn, task["job_id"], now, {"status": int(status), "stopped": stopped_at}, profile=profile)
    else:
        _set_task(conn, task, now, {})
    reported = {s.id: s for s in state.steps}
    for step in task_steps(conn, task["id"]):
        result = 0
        started = step["started"]
        values = {}
        if step["idx"] in reported:
            given = reported[step["idx"]]
            result = given.result
            started = _seconds(given, "started_at")
            values = {
                "log_index": given.log_index,
                "log_length": given.log_length,
                "started": started,
                "stopped": _seconds(given, "stopped_at"),
            }
        if result != 0:
            values["status"] = int(Status.from_result(result))
        elif started != 0:
            values["status"] = int(Status.RUNNING)
        update_step(conn, step["id"], values)
    fresh = get_task(conn, task["id"])
    assert fresh is not None
    return fresh


def update_step(conn: sqlite3.Connection, step_id: int, values: Mapping[str, int]) -> None:
    """xorm's `Update(step)` without columns: only non-zero fields are written, so a zero
    (an unreported time, log index or length, an unknown result) keeps the stored value."""
    written = {k: v for k, v in values.items() if v != 0}
    if written:
        sets = ", ".join(f"{k} = ?" for k in written)
        conn.execute(f"UPDATE task_step SET {sets} WHERE id = ?", (*written.values(), step_id))


def _seconds(msg: Any, name: str) -> int:
    """`convertTimestamp`: an absent or zero timestamp is 0, else its Unix seconds."""
    if not msg.HasField(name):
        return 0
    stamp = getattr(msg, name)
    return 0 if stamp.seconds == 0 and stamp.nanos == 0 else int(stamp.seconds)


def insert_outputs(conn: sqlite3.Connection, task_id: int, outputs: Mapping[str, str]) -> list[str]:
    """Outputs first-write-wins within Gitea's limits; returns all stored keys."""
    for key, value in outputs.items():
        if len(key.encode()) > MAX_OUTPUT_KEY_BYTES or len(value.encode()) > MAX_OUTPUT_VALUE_BYTES:
            continue
        conn.execute(
            "INSERT OR IGNORE INTO task_output (task_id, output_key, output_value) VALUES (?, ?, ?)",
            (task_id, key, value),
        )
    return [r["output_key"] for r in conn.execute("SELECT output_key FROM task_output WHERE task_id = ?", (task_id,))]


# -- stopping and cancelling ---------------------------------------------------------


def stop_task(conn: sqlite3.Connection, task_id: int, status: Status, now: int, *, profile: Profile) -> None:
    """`StopTask`: `cancelling` only for runners that declared the capability (main), else a
    final status for task, job and every unfinished step — which deletes an ephemeral runner."""
    task = get_task(conn, task_id)
    if task is None or Status(task["status"]).is_done():
        return
    if status is Status.CANCELLING:
        runner = runner_db.get_runner(conn, runner_id=task["runner_id"])
        if not profile.cancelling or runner is None or not runner["has_cancelling_support"]:
            status = Status.CANCELLED
    if status is Status.CANCELLING:
        runs.update_run_job(conn, task["job_id"], now, {"status": int(status)}, profile=profile)
        _set_task(conn, task, now, {"status": int(status)})
        return
    runs.update_run_job(conn, task["job_id"], now, {"status": int(status), "stopped": now}, profile=profile)
    _set_task(conn, task, now, {"status": int(status), "stopped": now})
    for step in task_steps(conn, task_id):
        if not Status(step["status"]).is_done():
            update_step(conn, step["id"], {"status": int(status), "started": step["started"] or now, "stopped": now})


def cancel_jobs(conn: sqlite3.Connection, jobs: list[Row], now: int, *, profile: Profile) -> None:
    """`CancelJobs`: jobs without a task are cancelled, tasks are stopped as cancelling."""
    for job in jobs:
        if Status(job["status"]).is_done():
            continue
        if job["task_id"] == 0:
            runs.update_run_job(
                conn,
                job["id"],
                now,
                {"status": int(Status.CANCELLED), "stopped": now},
                {"task_id": 0},
                profile=profile,
            )
        else:
            stop_task(conn, job["task_id"], Status.CANCELLING, now, profile=profile)


def tasks_before(conn: sqlite3.Connection, column: str, before: int) -> list[Row]:
    """Running, then cancelling tasks whose `column` (`updated` or `started`) is older than
    `before` (`stopTasksByStatuses`)."""
    assert column in ("updated", "started")
    found: list[Row] = []
    for status in (Status.RUNNING, Status.CANCELLING):
        found.extend(
            conn.execute(f"SELECT * FROM task WHERE status = ? AND {column} < ? ORDER BY id", (int(status), before))
        )
    return found
