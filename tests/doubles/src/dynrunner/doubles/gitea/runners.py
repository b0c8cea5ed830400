"""Owners, repositories, registration tokens, runners and `tasks_version` rows.

Sources: Gitea `models/actions/runner_token.go` (multi-use tokens, a new token deactivates
the scope's older ones), `models/actions/runner.go` (runner rows, soft delete, label match,
heartbeat debounce), `models/actions/tasks_version.go` (per-scope versions).
"""

from __future__ import annotations

import sqlite3
import uuid as uuidlib
from collections.abc import Sequence

from dynrunner.doubles.gitea.store import Row, dumps, loads
from dynrunner.doubles.gitea.tokens import SaltedToken, random_alnum
from dynrunner.doubles.gitea.truncate import ellipsis_display

RUNNER_HEARTBEAT_INTERVAL_S = 30  # last_online is persisted at most this often
RUNNER_ACTIVE_INTERVAL_S = 5  # last_active likewise
RUNNER_OFFLINE_S = 60
RUNNER_IDLE_S = 10
_ACTIVE_METHODS = ("UpdateTask", "UpdateLog")


# -- owners and repositories ---------------------------------------------------------


def ensure_owner(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute("SELECT id FROM owner WHERE name = ?", (name,)).fetchone()
    if row:
        return int(row["id"])
    return int(conn.execute("INSERT INTO owner (name) VALUES (?)", (name,)).lastrowid or 0)


def split_repository(full_name: str) -> tuple[str, str]:
    owner, sep, name = full_name.partition("/")
    if not sep or not owner or not name or "/" in name:
        raise ValueError(f"repository must be 'owner/name', got {full_name!r}")
    return owner, name


def ensure_repository(conn: sqlite3.Connection, full_name: str) -> tuple[int, int]:
    """(owner_id, repo_id), creating both on first use."""
    owner, name = split_repository(full_name)
    owner_id = ensure_owner(conn, owner)
    row = conn.execute("SELECT id FROM repository WHERE owner_id = ? AND name = ?", (owner_id, name)).fetchone()
    if row:
        return owner_id, int(row["id"])
    cur = conn.execute("INSERT INTO repository (owner_id, name) VALUES (?, ?)", (owner_id, name))
    return owner_id, int(cur.lastrowid or 0)


def repository_names(conn: sqlite3.Connection, repo_id: int) -> tuple[str, str]:
    row = conn.execute(
        "SELECT owner.name AS owner, repository.name AS name FROM repository JOIN owner ON owner.id = "
        "repository.owner_id WHERE repository.id = ?",
        (repo_id,),
    ).fetchone()
    return str(row["owner"]), str(row["name"])


# -- registration tokens -------------------------------------------------------------


def new_registration_token(conn: sqlite3.Connection, owner_id: int, repo_id: int, now: int, token: str = "") -> str:
    """`NewRunnerTokenWithValue`: deactivate the scope's tokens, insert an active one."""
    if repo_id:
        owner_id = 0
    token = token or random_alnum(40)
    conn.execute("UPDATE runner_token SET is_active = 0 WHERE owner_id = ? AND repo_id = ?", (owner_id, repo_id))
    conn.execute(
        "INSERT INTO runner_token (token, owner_id, repo_id, is_active, created) VALUES (?, ?, ?, 1, ?)",
        (token, owner_id, repo_id, now),
    )
    return token


def get_registration_token(conn: sqlite3.Connection, token: str) -> Row | None:
    row: Row | None = conn.execute("SELECT * FROM runner_token WHERE token = ?", (token,)).fetchone()
    return row


# -- runners -------------------------------------------------------------------------


def create_runner(
    conn: sqlite3.Connection,
    *,
    name: str,
    owner_id: int,
    repo_id: int,
    version: str,
    labels: Sequence[str],
    ephemeral: bool,
    cancelling: bool,
    token: SaltedToken,
    now: int,
) -> int:
    if owner_id and repo_id:
        owner_id = 0
    cur = conn.execute(
        "INSERT INTO runner (uuid, name, version, owner_id, repo_id, token_hash, token_salt, labels, ephemeral, "
        "has_cancelling_support, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            str(uuidlib.uuid4()),
            ellipsis_display(name, 255),
            version,
            owner_id,
            repo_id,
            token.hash,
            token.salt,
            dumps(list(labels)),
            int(ephemeral),
            int(cancelling),
            now,
            now,
        ),
    )
    return int(cur.lastrowid or 0)


def get_runner(conn: sqlite3.Connection, *, uuid: str | None = None, runner_id: int | None = None) -> Row | None:
    if uuid is not None:
        row: Row | None = conn.execute("SELECT * FROM runner WHERE uuid = ? AND deleted = 0", (uuid,)).fetchone()
    else:
        row = conn.execute("SELECT * FROM runner WHERE id = ? AND deleted = 0", (runner_id,)).fetchone()
    return row


def runner_labels(runner: Row) -> list[str]:
    labels: list[str] = loads(runner["labels"])
    return labels


def can_match_labels(runner_labels: Sequence[str], runs_on: Sequence[str]) -> bool:
    """`CanMatchLabels`: the runner's label set contains every `runs-on` label (none → all)."""
    return set(runs_on) <= set(runner_labels)


def heartbeat_due(runner: Row, method: str, now: int, *, debounced: bool) -> bool:
    """Whether the interceptor writes the runner row: on every call before main's debouncing
    (PR #38281), else only when `last_online` (30 s) or, for UpdateTask/UpdateLog,
    `last_active` (5 s) is stale (`ShouldPersistLastOnline/Active`)."""
    if not debounced:
        return True
    return now - runner["last_online"] >= RUNNER_HEARTBEAT_INTERVAL_S or (
        method in _ACTIVE_METHODS and now - runner["last_active"] >= RUNNER_ACTIVE_INTERVAL_S
    )


def touch_runner(conn: sqlite3.Connection, runner: Row, method: str, now: int, *, debounced: bool) -> None:
    """The interceptor's heartbeat bookkeeping: `last_online`, and `last_active` for
    UpdateTask/UpdateLog, each written when due (`heartbeat_due`)."""
    cols: dict[str, int] = {}
    if method in _ACTIVE_METHODS and (not debounced or now - runner["last_active"] >= RUNNER_ACTIVE_INTERVAL_S):
        cols["last_active"] = now
    if not debounced or now - runner["last_online"] >= RUNNER_HEARTBEAT_INTERVAL_S:
        cols["last_online"] = now
    if cols:
        sets = ", ".join(f"{k} = ?" for k in cols)
        conn.execute(f"UPDATE runner SET {sets}, updated = ? WHERE id = ?", (*cols.values(), now, runner["id"]))


def delete_runner(conn: sqlite3.Connection, runner_id: int, now: int) -> None:
    conn.execute("UPDATE runner SET deleted = ? WHERE id = ? AND deleted = 0", (now, runner_id))


def delete_ephemeral_runner(conn: sqlite3.Connection, runner_id: int, now: int) -> None:
    """`DeleteEphemeralRunner`: only ephemeral runners, a missing runner is fine."""
    conn.execute("UPDATE runner SET deleted = ? WHERE id = ? AND ephemeral = 1 AND deleted = 0", (now, runner_id))


def set_runner_disabled(conn: sqlite3.Connection, runner_id: int, disabled: bool, now: int) -> None:
    """`SetRunnerDisabled`: a change bumps the runner scope's tasks version."""
    runner = get_runner(conn, runner_id=runner_id)
    if runner is None:
        raise KeyError(f"runner {runner_id} does not exist")
    if bool(runner["is_disabled"]) == disabled:
        return
    conn.execute("UPDATE runner SET is_disabled = ?, updated = ? WHERE id = ?", (int(disabled), now, runner_id))
    increase_tasks_version(conn, runner["owner_id"], runner["repo_id"])


def runner_status(runner: Row, now: int) -> str:
    """`ActionRunner.Status` as Gitea's UI names it."""
    if now - runner["last_online"] > RUNNER_OFFLINE_S:
        return "offline"
    if now - runner["last_active"] > RUNNER_IDLE_S:
        return "idle"
    return "active"


# -- tasks_version -------------------------------------------------------------------


def get_tasks_version(conn: sqlite3.Connection, owner_id: int, repo_id: int) -> int:
    row = conn.execute(
        "SELECT version FROM tasks_version WHERE owner_id = ? AND repo_id = ?", (owner_id, repo_id)
    ).fetchone()
    return int(row["version"]) if row else 0


def _increase_scope(conn: sqlite3.Connection, owner_id: int, repo_id: int) -> None:
    cur = conn.execute(
        "UPDATE tasks_version SET version = version + 1 WHERE owner_id = ? AND repo_id = ?", (owner_id, repo_id)
    )
    if cur.rowcount == 0:
        conn.execute("INSERT INTO tasks_version (owner_id, repo_id, version) VALUES (?, ?, 1)", (owner_id, repo_id))


def increase_tasks_version(conn: sqlite3.Connection, owner_id: int, repo_id: int) -> None:
    """`IncreaseTaskVersion`: global, then the owner row, then the repo row."""
    _increase_scope(conn, 0, 0)
    if owner_id > 0:
        _increase_scope(conn, owner_id, 0)
    if repo_id > 0:
        _increase_scope(conn, 0, repo_id)
