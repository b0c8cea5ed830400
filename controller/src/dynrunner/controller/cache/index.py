"""The cache server's index: entries, their scopes and use, and the jobs allowed to use them.

One SQLite file (`<dir>/index.db`). The bytes of an entry live in the ArtifactStore; the index
says which entry is where, which repository and ref scope it belongs to, when it was last used
(for LRU eviction and retention) and which registered job (by token digest) may do what.
Losing the index loses the cache, nothing else: blobs it no longer names are swept.

An entry belongs to a repository by Gitea's id *and* name (`RepoKey`): a repository created
again under an old name has another id and finds nothing of its predecessor's. Every query
names one repository (indexed), so a repository's lookups, listings and evictions cost the same
however many entries the others have.

Matching, as GitHub documents it: in each readable scope in turn (the job's ref, a pull
request's base branch, the default branch), for each key in turn (the primary key, then the
restore keys), an entry whose key equals it, else the newest whose key starts with it
(case-sensitive); the version must always be equal.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dynrunner.controller.cache.grants import Grant

TABLES = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entry (
  id INTEGER PRIMARY KEY AUTOINCREMENT, repo TEXT NOT NULL, scope TEXT NOT NULL, key TEXT NOT NULL,
  version TEXT NOT NULL, size INTEGER NOT NULL DEFAULT 0, location TEXT NOT NULL DEFAULT '',
  complete INTEGER NOT NULL DEFAULT 0, writer TEXT NOT NULL, created REAL NOT NULL,
  used REAL NOT NULL, repo_id INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS job (
  token_sha256 TEXT PRIMARY KEY, repo TEXT NOT NULL, scope TEXT NOT NULL, reads TEXT NOT NULL,
  results_url TEXT NOT NULL, task_id INTEGER NOT NULL, expires REAL NOT NULL,
  repo_id INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS revoked (token_sha256 TEXT PRIMARY KEY, expires REAL NOT NULL);
"""
INDEXES = """
DROP INDEX IF EXISTS entry_match;
CREATE INDEX IF NOT EXISTS entry_scope ON entry (repo_id, repo, scope, version, key);
CREATE INDEX IF NOT EXISTS entry_key ON entry (repo_id, repo, key);
CREATE INDEX IF NOT EXISTS entry_lru ON entry (repo_id, repo, complete, used);
CREATE INDEX IF NOT EXISTS entry_used ON entry (complete, used);
CREATE INDEX IF NOT EXISTS entry_writer ON entry (writer, complete);
"""
_REPO = "repo_id = ? AND repo = ?"

RepoKey = tuple[int, str]
"""A repository as entries belong to it: (Gitea's id or 0, `owner/name`)."""


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
    repo_id: int = 0

    @property
    def repository(self) -> RepoKey:
        return (self.repo_id, self.repo)


def repository(job: Grant) -> RepoKey:
    return (job.repo_id, job.repo)


class Conflict(Exception):
    """An entry with this key and version exists in the scope, or another job is writing it."""


class TooManyPending(Exception):
    """The job has as many uploads open as it may."""


class Revoked(Exception):
    """The token was revoked; its grant may not register it again."""


def _entry(row: sqlite3.Row) -> Entry:
    return Entry(**dict(zip(row.keys(), row, strict=True)) | {"complete": bool(row["complete"])})


class Index:
    def __init__(self, path: Path, clock: Callable[[], float]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(TABLES)
        for table in ("entry", "job"):  # an index written before repository ids
            columns = {row["name"] for row in self._conn.execute(f"PRAGMA table_info({table})")}
            if "repo_id" not in columns:
                self._conn.execute(f"ALTER TABLE {table} ADD COLUMN repo_id INTEGER NOT NULL DEFAULT 0")
        self._conn.executescript(INDEXES)
        self.epoch = self._epoch()

    def _epoch(self) -> str:
        """This index's random name, made with it: URLs signed for its entries name it, so they
        serve nothing once it is lost. Its entry ids start at the time it was made (in ms), so
        a new index does not hand out its predecessor's ids either (staging left behind, logs)."""
        with self._tx() as conn:
            row = conn.execute("SELECT value FROM meta WHERE name = 'epoch'").fetchone()
            if row is not None:
                return str(row["value"])
            epoch = secrets.token_hex(16)
            conn.execute("INSERT INTO meta (name, value) VALUES ('epoch', ?)", (epoch,))
            if conn.execute("SELECT 1 FROM sqlite_sequence WHERE name = 'entry'").fetchone() is None:
                conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('entry', ?)", (int(self.clock() * 1000),))
            return epoch

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
        """Revoked when this token was revoked: its revocation is kept until the grant expires."""
        with self._tx() as conn:
            if conn.execute(
                "SELECT 1 FROM revoked WHERE token_sha256 = ? AND expires > ?", (grant.token_sha256, self.clock())
            ).fetchone():
                raise Revoked("this token was revoked: its job has ended")
            conn.execute(
                "INSERT OR REPLACE INTO job (token_sha256, repo_id, repo, scope, reads, results_url, task_id, expires) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (grant.token_sha256, grant.repo_id, grant.repo, grant.scope, json.dumps(grant.reads),
                 grant.results_url, grant.task_id, grant.expires),
            )  # fmt: skip

    def revoke(self, token_sha256: str) -> bool:
        """End a registration, and remember that until its grant expires. A token that is not
        registered leaves nothing behind (so unauthenticated revocations cannot grow the index)."""
        with self._tx() as conn:
            row = conn.execute("SELECT expires FROM job WHERE token_sha256 = ?", (token_sha256,)).fetchone()
            if row is None:
                return False
            conn.execute(
                "INSERT INTO revoked (token_sha256, expires) VALUES (?, ?) ON CONFLICT (token_sha256) "
                "DO UPDATE SET expires = max(expires, excluded.expires)",
                (token_sha256, row["expires"]),
            )
            conn.execute("DELETE FROM job WHERE token_sha256 = ?", (token_sha256,))
            return True

    def revoked_count(self) -> int:
        with self._tx() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM revoked").fetchone()[0])

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
            repo_id=row["repo_id"],
        )

    def forget_expired(self) -> None:
        """Registrations and revocations past their grants' expiry."""
        now = self.clock()
        with self._tx() as conn:
            conn.execute("DELETE FROM job WHERE expires <= ?", (now,))
            conn.execute("DELETE FROM revoked WHERE expires <= ?", (now,))

    # -- entries -----------------------------------------------------------------------------

    def lookup(self, job: Grant, keys: list[str], version: str) -> Entry | None:
        """The entry to restore for these keys (and count it as used), or None."""
        with self._tx() as conn:
            for scope in job.reads:
                for key in keys:
                    row = conn.execute(
                        f"SELECT * FROM entry WHERE {_REPO} AND scope = ? AND version = ? AND complete = 1 AND "
                        "(key = ? OR (key > ? AND substr(key, 1, ?) = ?)) "
                        "ORDER BY key = ? DESC, created DESC, id DESC LIMIT 1",
                        (*repository(job), scope, version, key, key, len(key), key, key),
                    ).fetchone()
                    if row is not None:
                        conn.execute("UPDATE entry SET used = ? WHERE id = ?", (self.clock(), row["id"]))
                        return _entry(row)
        return None

    def listing(self, job: Grant, key: str) -> list[Entry]:
        """The job's repository's complete entries of `key`, in every scope."""
        with self._tx() as conn:
            rows = conn.execute(
                f"SELECT * FROM entry WHERE {_REPO} AND key = ? AND complete = 1 ORDER BY id", (*repository(job), key)
            )
            return [_entry(row) for row in rows]

    def reserve(self, job: Grant, key: str, version: str, max_pending: int) -> Entry:
        """A new entry for the job to upload into. Conflict when the scope has this key and
        version already, or another job is uploading it (a reservation of the same job is
        handed back, so a retried request is no conflict); TooManyPending when the job has
        `max_pending` reservations open."""
        now = self.clock()
        with self._tx() as conn:
            rows = conn.execute(
                f"SELECT * FROM entry WHERE {_REPO} AND scope = ? AND key = ? AND version = ?",
                (*repository(job), job.scope, key, version),
            ).fetchall()
            for row in rows:
                if row["complete"]:
                    raise Conflict(f"Cache already exists for key {key!r} and version {version!r}")
                if row["writer"] == job.token_sha256:
                    return _entry(row)
                raise Conflict(f"Unable to reserve cache with key {key}, another job may be creating this cache.")
            open_now = conn.execute(
                "SELECT COUNT(*) FROM entry WHERE writer = ? AND complete = 0", (job.token_sha256,)
            ).fetchone()[0]
            if open_now >= max_pending:
                raise TooManyPending(f"this job has {open_now} cache uploads open, the most it may; commit one first")
            cur = conn.execute(
                "INSERT INTO entry (repo_id, repo, scope, key, version, writer, created, used) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*repository(job), job.scope, key, version, job.token_sha256, now, now),
            )
            row = conn.execute("SELECT * FROM entry WHERE id = ?", (cur.lastrowid,)).fetchone()
        return _entry(row)

    def get(self, entry_id: int) -> Entry | None:
        with self._tx() as conn:
            row = conn.execute("SELECT * FROM entry WHERE id = ?", (entry_id,)).fetchone()
        return _entry(row) if row is not None else None

    def existing(self, entry_ids: Iterable[int]) -> set[int]:
        with self._tx() as conn:
            return {i for i in entry_ids if conn.execute("SELECT 1 FROM entry WHERE id = ?", (i,)).fetchone()}

    def pending(self, job: Grant, key: str, version: str) -> Entry | None:
        """The job's own reservation of this key and version (v2 finalizes by key, not id)."""
        with self._tx() as conn:
            row = conn.execute(
                f"SELECT * FROM entry WHERE {_REPO} AND scope = ? AND key = ? AND version = ? AND complete = 0 "
                "AND writer = ?",
                (*repository(job), job.scope, key, version, job.token_sha256),
            ).fetchone()
        return _entry(row) if row is not None else None

    def pending_of(self, writer: str) -> list[Entry]:
        with self._tx() as conn:
            rows = conn.execute("SELECT * FROM entry WHERE writer = ? AND complete = 0", (writer,))
            return [_entry(row) for row in rows]

    def abandoned(self) -> list[Entry]:
        """Reservations whose job is no longer registered: nobody can commit them any more."""
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT * FROM entry WHERE complete = 0 AND writer NOT IN (SELECT token_sha256 FROM job)"
            )
            return [_entry(row) for row in rows]

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
        """Whether any entry still stores its bytes at `location` (identical archives share one
        blob; the store's scope is the repository's name, whatever its id)."""
        with self._tx() as conn:
            row = conn.execute("SELECT 1 FROM entry WHERE repo = ? AND location = ? LIMIT 1", (repo, location))
            return row.fetchone() is not None

    # -- limits ------------------------------------------------------------------------------

    def over_limit(self, repo: RepoKey | None, limit: int, keep: int, max_entries: int | None = None) -> list[Entry]:
        """Complete entries (of `repo`, or all) to evict, least recently used first, until the
        rest fit in `limit` bytes and `max_entries` entries; never the entry `keep` (the one
        just written). Counted first: a repository within its limits reads no rows."""
        where, args = (f"{_REPO} AND ", repo) if repo is not None else ("", ())
        with self._tx() as conn:
            count, total = conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entry WHERE {where}complete = 1", args
            ).fetchone()
            count_limit = count if max_entries is None else max_entries
            if total <= limit and count <= count_limit:
                return []
            rows = conn.execute(f"SELECT * FROM entry WHERE {where}complete = 1 ORDER BY used ASC, id ASC", args)
            victims = []
            for row in rows:
                if total <= limit and count <= count_limit:
                    break
                if row["id"] == keep:
                    continue
                victims.append(_entry(row))
                total -= row["size"]
                count -= 1
        return victims

    def repositories(self) -> list[RepoKey]:
        with self._tx() as conn:
            return [(row[0], row[1]) for row in conn.execute("SELECT DISTINCT repo_id, repo FROM entry")]

    def stale(self, repo: RepoKey, unused_before: float, pending_before: float) -> list[Entry]:
        """The repository's entries nobody used since `unused_before`, and its reservations
        never completed since `pending_before`."""
        with self._tx() as conn:
            rows = conn.execute(
                f"SELECT * FROM entry WHERE {_REPO} AND "
                "((complete = 1 AND used < ?) OR (complete = 0 AND created < ?))",
                (*repo, unused_before, pending_before),
            )
            return [_entry(row) for row in rows]

    def repo_size(self, repo: str) -> int:
        with self._tx() as conn:
            row = conn.execute("SELECT COALESCE(SUM(size), 0) FROM entry WHERE repo = ? AND complete = 1", (repo,))
            return int(row.fetchone()[0])

    def entries(self) -> list[Entry]:
        """Every entry (tests, tools: the server itself never reads them all)."""
        with self._tx() as conn:
            return [_entry(row) for row in conn.execute("SELECT * FROM entry ORDER BY id")]
