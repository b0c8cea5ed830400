"""SQLite state of one double instance: schema, connections, transactions, clock.

Tables mirror Gitea's `action_*` tables in the columns the runner protocol touches. Write
transactions are `BEGIN IMMEDIATE`, so like Gitea's `db.WithTx` each is atomic, and a
claim's `UPDATE ... WHERE task_id = 0 AND status = waiting` decides races between
runners exactly as it does on Gitea's database. WAL mode lets readers (the candidate
scan) run beside a writer, so two runners really can pick the same candidate and one of
them really does lose the update.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS owner (
  id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS repository (
  id INTEGER PRIMARY KEY AUTOINCREMENT, owner_id INTEGER NOT NULL, name TEXT NOT NULL,
  run_index INTEGER NOT NULL DEFAULT 0, is_private INTEGER NOT NULL DEFAULT 0,
  default_branch TEXT NOT NULL DEFAULT 'main', UNIQUE (owner_id, name)
);
CREATE TABLE IF NOT EXISTS runner_token (
  id INTEGER PRIMARY KEY AUTOINCREMENT, token TEXT NOT NULL UNIQUE, owner_id INTEGER NOT NULL DEFAULT 0,
  repo_id INTEGER NOT NULL DEFAULT 0, is_active INTEGER NOT NULL, created INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS runner (
  id INTEGER PRIMARY KEY AUTOINCREMENT, uuid TEXT NOT NULL UNIQUE, name TEXT NOT NULL, version TEXT NOT NULL,
  owner_id INTEGER NOT NULL DEFAULT 0, repo_id INTEGER NOT NULL DEFAULT 0, token_hash TEXT NOT NULL UNIQUE,
  token_salt TEXT NOT NULL, last_online INTEGER NOT NULL DEFAULT 0, last_active INTEGER NOT NULL DEFAULT 0,
  labels TEXT NOT NULL, ephemeral INTEGER NOT NULL DEFAULT 0, is_disabled INTEGER NOT NULL DEFAULT 0,
  has_cancelling_support INTEGER NOT NULL DEFAULT 0, created INTEGER NOT NULL, updated INTEGER NOT NULL,
  deleted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS tasks_version (
  id INTEGER PRIMARY KEY AUTOINCREMENT, owner_id INTEGER NOT NULL, repo_id INTEGER NOT NULL,
  version INTEGER NOT NULL, UNIQUE (owner_id, repo_id)
);
CREATE TABLE IF NOT EXISTS run (
  id INTEGER PRIMARY KEY AUTOINCREMENT, repo_id INTEGER NOT NULL, owner_id INTEGER NOT NULL,
  title TEXT NOT NULL, workflow_id TEXT NOT NULL, idx INTEGER NOT NULL, trigger_user TEXT NOT NULL,
  ref TEXT NOT NULL, commit_sha TEXT NOT NULL, event TEXT NOT NULL, event_payload TEXT NOT NULL,
  is_fork_pull_request INTEGER NOT NULL DEFAULT 0, status INTEGER NOT NULL, started INTEGER NOT NULL DEFAULT 0,
  stopped INTEGER NOT NULL DEFAULT 0, secrets TEXT NOT NULL, vars TEXT NOT NULL,
  created INTEGER NOT NULL, updated INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS run_job (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL, repo_id INTEGER NOT NULL,
  owner_id INTEGER NOT NULL, commit_sha TEXT NOT NULL, is_fork_pull_request INTEGER NOT NULL DEFAULT 0,
  name TEXT NOT NULL, attempt INTEGER NOT NULL, workflow_payload BLOB NOT NULL, job_id TEXT NOT NULL,
  needs TEXT NOT NULL, runs_on TEXT NOT NULL, step_names TEXT NOT NULL, has_if INTEGER NOT NULL,
  continue_on_error INTEGER NOT NULL, task_id INTEGER NOT NULL DEFAULT 0, status INTEGER NOT NULL,
  started INTEGER NOT NULL DEFAULT 0, stopped INTEGER NOT NULL DEFAULT 0,
  created INTEGER NOT NULL, updated INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS run_job_pick ON run_job (status, task_id, updated, id);
CREATE TABLE IF NOT EXISTS task (
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, attempt INTEGER NOT NULL,
  runner_id INTEGER NOT NULL, status INTEGER NOT NULL, started INTEGER NOT NULL DEFAULT 0,
  stopped INTEGER NOT NULL DEFAULT 0, repo_id INTEGER NOT NULL, owner_id INTEGER NOT NULL,
  commit_sha TEXT NOT NULL, token_hash TEXT NOT NULL UNIQUE, token_salt TEXT NOT NULL,
  token_last_eight TEXT NOT NULL, token_plain TEXT NOT NULL, log_filename TEXT NOT NULL DEFAULT '',
  log_in_storage INTEGER NOT NULL DEFAULT 0, log_length INTEGER NOT NULL DEFAULT 0,
  log_size INTEGER NOT NULL DEFAULT 0, log_indexes TEXT NOT NULL DEFAULT '[]',
  created INTEGER NOT NULL, updated INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS task_runner ON task (runner_id);
CREATE TABLE IF NOT EXISTS task_step (
  id INTEGER PRIMARY KEY AUTOINCREMENT, task_id INTEGER NOT NULL, name TEXT NOT NULL, idx INTEGER NOT NULL,
  status INTEGER NOT NULL, log_index INTEGER NOT NULL DEFAULT 0, log_length INTEGER NOT NULL DEFAULT 0,
  started INTEGER NOT NULL DEFAULT 0, stopped INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS task_step_task ON task_step (task_id, idx);
CREATE TABLE IF NOT EXISTS artifact (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL, runner_id INTEGER NOT NULL,
  repo_id INTEGER NOT NULL, owner_id INTEGER NOT NULL, commit_sha TEXT NOT NULL,
  storage_path TEXT NOT NULL DEFAULT '', file_size INTEGER NOT NULL DEFAULT 0,
  file_compressed_size INTEGER NOT NULL DEFAULT 0, content_encoding TEXT NOT NULL DEFAULT '',
  artifact_path TEXT NOT NULL, artifact_name TEXT NOT NULL, status INTEGER NOT NULL,
  created INTEGER NOT NULL, updated INTEGER NOT NULL, expired INTEGER NOT NULL,
  UNIQUE (run_id, artifact_name, artifact_path)
);
CREATE TABLE IF NOT EXISTS task_output (
  id INTEGER PRIMARY KEY AUTOINCREMENT, task_id INTEGER NOT NULL, output_key TEXT NOT NULL,
  output_value TEXT NOT NULL, UNIQUE (task_id, output_key)
);
"""

Row = sqlite3.Row


class Clock:
    """Unix seconds, as Gitea's `timeutil.TimeStamp`; tests move it forward instead of sleeping."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def now(self) -> int:
        return int(time.time() + self.offset_s)

    def advance(self, seconds: float) -> None:
        self.offset_s += seconds


class Store:
    """A small pool of connections to one SQLite file, safe to use from worker threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # Writers queue here rather than in SQLite's busy handler, whose sleeps (up to
        # 100 ms each) would dominate under concurrent runners.
        self._write_lock = threading.Lock()
        self._closed = False
        conn = self._connect()
        conn.executescript(SCHEMA)
        self._pool.put(conn)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        with self._lock:
            self._all.append(conn)
        return conn

    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        if self._closed:
            raise RuntimeError("the double's store is closed")
        try:
            conn = self._pool.get_nowait()
        except queue.Empty:
            conn = self._connect()
        try:
            yield conn
        finally:
            self._pool.put(conn)

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """Autocommit reads (each statement sees the latest committed state)."""
        with self._conn() as conn:
            yield conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One transaction holding SQLite's write lock from its start (`BEGIN IMMEDIATE`)."""
        with self._write_lock, self._conn() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        self._closed = True
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False)


def loads(text: str) -> Any:
    return json.loads(text)
