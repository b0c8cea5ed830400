"""The cache server's index: entries, their scopes and use, and the jobs allowed to use them.

One SQLite file (`<dir>/index.db`). The bytes of an entry live in the ArtifactStore; the index
says which entry is where, which repository and ref scope it belongs to, when it was last used
(for LRU eviction and retention) and which registered job (by token digest) may do what.
Losing the index loses the cache, nothing else: blobs it no longer names are swept.

Matching, as GitHub documents it: in each readable scope in turn (the job's ref, a pull
request's base branch, the default branch), for each key in turn (the primary key, then the
restore keys), an entry whose key equals it, else the newest whose key starts with it; the
version must always be equal.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dynrunner.controller.cache.grants import Grant

SCHEMA = """
CREATE TABLE IF NOT EXISTS entry (
  id INTEGER PRIMARY KEY AUTOINCREMENT, repo TEXT NOT NULL, scope TEXT NOT NULL, key TEXT NOT NULL,
  version TEXT NOT NULL, size INTEGER NOT NULL DEFAULT 0, location TEXT NOT NULL DEFAULT '',
  complete INTEGER NOT NULL DEFAULT 0, writer TEXT NOT NULL, created REAL NOT NULL,
  used REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS entry_match ON entry (repo, scope, version, key);
CREATE INDEX IF NOT EXISTS entry_used ON entry (complete, used);
CREATE TABLE IF NOT EXISTS job (
  token_sha256 TEXT PRIMARY KEY, repo TEXT NOT NULL, scope TEXT NOT NULL, reads TEXT NOT NULL,
  results_url TEXT NOT NULL, task_id INTEGER NOT NULL, expires REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Entry:
    id: int
    repo: str
    scope: str
    key: str
    version: str
    size: int
    location: str
    complete: bool
    writer: str
    created: float
    used: float


class Conflict(Exception):
    """An entry with this key and version exists in the scope, or another job is writing it."""


def _entry(row: sqlite3.Row) -> Entry:
    return Entry(**dict(zip(row.keys(), row, strict=True)) | {"complete": bool(row["complete"])})


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class Index:
    def __init__(self, path: Path, clock: Callable[[], float]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    # -- jobs --------------------------------------------------------------------------------

    def register(self, grant: Grant) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO job (token_sha256, repo, scope, reads, results_url, task_id, expires) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (grant.token_sha256, grant.repo, grant.scope, json.dumps(grant.reads), grant.results_url,
                 grant.task_id, grant.expires),
            )  # fmt: skip

    def revoke(self, token_sha256: str) -> bool:
        with self._tx() as conn:
            return conn.execute("DELETE FROM job WHERE token_sha256 = ?", (token_sha256,)).rowcount > 0

    def job(self, token_sha256: str) -> Grant | None:
        with self._tx() as conn:
            row = conn.execute(
                "SELECT * FROM job WHERE token_sha256 = ? AND expires > ?", (token_sha256, self.clock())
            ).fetchone()
        if row is None:
            return None
        return Grant(
            repo=row["repo"],
            scope=row["scope"],
            reads=tuple(json.loads(row["reads"])),
            token_sha256=row["token_sha256"],
            task_id=row["task_id"],
            expires=int(row["expires"]),
            results_url=row["results_url"],
        )

    # -- entries -----------------------------------------------------------------------------

    def lookup(self, job: Grant, keys: list[str], version: str) -> Entry | None:
        """The entry to restore for these keys (and count it as used), or None."""
        with self._tx() as conn:
            for scope in job.reads:
                for key in keys:
                    row = conn.execute(
                        "SELECT * FROM entry WHERE repo = ? AND scope = ? AND version = ? AND complete = 1 AND "
                        "(key = ? OR key LIKE ? ESCAPE '\\') ORDER BY key = ? DESC, created DESC, id DESC LIMIT 1",
                        (job.repo, scope, version, key, _like(key), key),
                    ).fetchone()
                    if row is not None:
                        conn.execute("UPDATE entry SET used = ? WHERE id = ?", (self.clock(), row["id"]))
                        return _entry(row)
        return None

    def reserve(self, job: Grant, key: str, version: str) -> Entry:
        """A new entry for the job to upload into. Conflict when the scope has this key and
        version already, or another job is uploading it (a reservation of the same job is
        handed back, so a retried request is no conflict)."""
        now = self.clock()
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT * FROM entry WHERE repo = ? AND scope = ? AND key = ? AND version = ?",
                (job.repo, job.scope, key, version),
            ).fetchall()
            for row in rows:
                if row["complete"]:
                    raise Conflict(f"Cache already exists for key {key!r} and version {version!r}")
                if row["writer"] == job.token_sha256:
                    return _entry(row)
                raise Conflict(f"Unable to reserve cache with key {key}, another job may be creating this cache.")
            cur = conn.execute(
                "INSERT INTO entry (repo, scope, key, version, writer, created, used) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job.repo, job.scope, key, version, job.token_sha256, now, now),
            )
            row = conn.execute("SELECT * FROM entry WHERE id = ?", (cur.lastrowid,)).fetchone()
        return _entry(row)

    def get(self, entry_id: int) -> Entry | None:
        with self._tx() as conn:
            row = conn.execute("SELECT * FROM entry WHERE id = ?", (entry_id,)).fetchone()
        return _entry(row) if row is not None else None

    def pending(self, job: Grant, key: str, version: str) -> Entry | None:
        """The job's own reservation of this key and version (v2 finalizes by key, not id)."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT * FROM entry WHERE repo = ? AND scope = ? AND key = ? AND version = ? AND complete = 0 "
                "AND writer = ?",
                (job.repo, job.scope, key, version, job.token_sha256),
            ).fetchone()
        return _entry(row) if row is not None else None

    def complete(self, entry_id: int, location: str, size: int) -> None:
        now = self.clock()
        with self._tx() as conn:
            conn.execute(
                "UPDATE entry SET complete = 1, location = ?, size = ?, created = ?, used = ? WHERE id = ?",
                (location, size, now, now, entry_id),
            )

    def touch(self, entry_id: int) -> None:
        with self._tx() as conn:
            conn.execute("UPDATE entry SET used = ? WHERE id = ?", (self.clock(), entry_id))

    def remove(self, entry_id: int) -> Entry | None:
        with self._tx() as conn:
            row = conn.execute("SELECT * FROM entry WHERE id = ?", (entry_id,)).fetchone()
            conn.execute("DELETE FROM entry WHERE id = ?", (entry_id,))
        return _entry(row) if row is not None else None

    def referenced(self, repo: str, location: str) -> bool:
        """Whether any entry still stores its bytes at `location` (identical archives share one blob)."""
        with self._tx() as conn:
            row = conn.execute("SELECT 1 FROM entry WHERE repo = ? AND location = ? LIMIT 1", (repo, location))
            return row.fetchone() is not None

    # -- limits ------------------------------------------------------------------------------

    def over_limit(self, repo: str | None, limit: int, keep: int) -> list[Entry]:
        """Complete entries (of `repo`, or all) to evict, least recently used first, until the
        rest fit in `limit` bytes; never the entry `keep` (the one just written)."""
        with self._tx() as conn:
            where, args = ("repo = ? AND ", (repo,)) if repo is not None else ("", ())
            rows = conn.execute(
                f"SELECT * FROM entry WHERE {where}complete = 1 ORDER BY used ASC, id ASC", args
            ).fetchall()
        total = sum(row["size"] for row in rows)
        victims = []
        for row in rows:
            if total <= limit:
                break
            if row["id"] == keep:
                continue
            victims.append(_entry(row))
            total -= row["size"]
        return victims

    def stale(self, unused_before: float, pending_before: float) -> list[Entry]:
        """Entries nobody used since `unused_before`, and reservations never completed since
        `pending_before`."""
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT * FROM entry WHERE (complete = 1 AND used < ?) OR (complete = 0 AND created < ?)",
                (unused_before, pending_before),
            ).fetchall()
            conn.execute("DELETE FROM job WHERE expires <= ?", (self.clock(),))
        return [_entry(row) for row in rows]

    def pending_ids(self, repo: str) -> list[int]:
        """The repository's reservations whose uploads are not committed yet."""
        with self._tx() as conn:
            return [row["id"] for row in conn.execute("SELECT id FROM entry WHERE repo = ? AND complete = 0", (repo,))]

    def repo_size(self, repo: str) -> int:
        with self._tx() as conn:
            row = conn.execute("SELECT COALESCE(SUM(size), 0) FROM entry WHERE repo = ? AND complete = 1", (repo,))
            return int(row.fetchone()[0])

    def entries(self) -> list[Entry]:
        with self._tx() as conn:
            return [_entry(row) for row in conn.execute("SELECT * FROM entry ORDER BY id")]

    def locations(self) -> set[tuple[str, str]]:
        with self._tx() as conn:
            rows = conn.execute("SELECT repo, location FROM entry WHERE location != ''")
            return {(row["repo"], row["location"]) for row in rows}
