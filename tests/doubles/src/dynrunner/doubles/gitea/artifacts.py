"""Gitea's Actions artifacts: rows, chunk files, merging, and who may call the API.

Both API generations share this (Gitea v1.26.1): `models/actions/artifact.go` (one row per
run, name and path; statuses), `routers/api/actions/artifacts_chunks.go` (chunks saved under
`tmp-upload/`, merged in order into one stored file once complete, checksum checked),
`artifacts_utils.go` (name rules, run check), `artifacts.go` `ArtifactContexter` (the bearer
credential). Files live under `<state-dir>/actions_artifacts/` as Gitea's storage keeps them.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import posixpath
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from dynrunner.doubles.gitea.httpio import HTTPError
from dynrunner.doubles.gitea.status import Status
from dynrunner.doubles.gitea.store import Row
from dynrunner.doubles.gitea.tokens import decode_runtime_token
from dynrunner.doubles.gitea.webauth import running_task_by_token

RETENTION_DAYS = 90  # setting.Actions.ArtifactRetentionDays
CONTENT_ENCODING_V3_GZIP = "gzip"
CONTENT_TYPE_ZIP = "application/zip"
_INVALID_NAME_CHARS = set('\\/":<>|*?\r\n')
_CHUNK_V3 = re.compile(r"^(\d+)-(\d+)-(\d+)-(\d+)\.chunk$")
_BLOCK_V4 = re.compile(r"^block-(\d+)-(\d+)-(\d+)-(.+)$")


class ArtifactStatus(enum.IntEnum):
    UPLOAD_PENDING = 1
    UPLOAD_CONFIRMED = 2
    UPLOAD_ERROR = 3
    EXPIRED = 4
    PENDING_DELETION = 5
    DELETED = 6


@dataclass(frozen=True, slots=True)
class ArtifactTask:
    """The task a request acts for (`ctx.ActionTask` with its job loaded)."""

    id: int
    run_id: int
    runner_id: int
    repo_id: int
    owner_id: int
    commit_sha: str


def path_join_rel(*elements: str) -> str:
    """`util.PathJoinRel`: each element cleaned as if rooted (no way above it), joined, relative."""
    parts = [posixpath.normpath("/" + e).lstrip("/") for e in elements if e]
    joined = posixpath.normpath("/" + "/".join(p for p in parts if p and p != "."))
    return "." if joined == "/" else joined.lstrip("/")


def path_join_rel_x(*elements: str) -> str:
    """`util.PathJoinRelX`: `PathJoinRel` with backslashes read as slashes."""
    return path_join_rel(*(e.replace("\\", "/") for e in elements))


def artifact_hash(name: str) -> str:
    return hashlib.md5(name.encode()).hexdigest()


def check_name(name: str) -> None:
    if any(c in _INVALID_NAME_CHARS for c in name):
        raise HTTPError(400, "Error checking artifact name contains invalid character")


# -- who calls ----------------------------------------------------------------------------


def task_of_request(conn: sqlite3.Connection, authorization: str, *, secret: bytes, iterations: int, now: int) -> Row:
    """`ArtifactContexter`: `Bearer <runtime token>` (a JWT; newer runners) or `Bearer <task
    token>` (older ones); the task must be running."""
    if not authorization.startswith("Bearer "):
        raise HTTPError(401, "Bad authorization header")
    token = authorization.split(" ", 1)[1]
    task_id = _task_id_of_jwt(token, secret, now)
    if task_id is not None:
        task: Row | None = conn.execute("SELECT * FROM task WHERE id = ?", (task_id,)).fetchone()
        if task is None:
            raise HTTPError(500, "Error runner api getting task by ID")
        if task["status"] != Status.RUNNING:
            raise HTTPError(500, "Error runner api getting task: task is not running")
        return task
    found = running_task_by_token(conn, token.removeprefix("Bearer "), iterations)
    if found is None or found["status"] != Status.RUNNING:
        raise HTTPError(500, "Error runner api getting task")
    return found


def _task_id_of_jwt(token: str, secret: bytes, now: int) -> int | None:
    """`TokenToTaskID`: the signature, `exp` and `nbf` hold; None otherwise."""
    try:
        claims = decode_runtime_token(token, secret)
    except (ValueError, UnicodeDecodeError):
        return None
    exp, nbf, task_id = claims.get("exp"), claims.get("nbf"), claims.get("TaskID")
    if (isinstance(exp, int) and now >= exp) or (isinstance(nbf, int) and now < nbf):
        return None
    return task_id if isinstance(task_id, int) else None


def artifact_task(conn: sqlite3.Connection, task: Row) -> ArtifactTask:
    job = conn.execute("SELECT run_id FROM run_job WHERE id = ?", (task["job_id"],)).fetchone()
    if job is None:
        raise HTTPError(500, "Error runner api getting job")
    return ArtifactTask(
        id=int(task["id"]),
        run_id=int(job["run_id"]),
        runner_id=int(task["runner_id"]),
        repo_id=int(task["repo_id"]),
        owner_id=int(task["owner_id"]),
        commit_sha=str(task["commit_sha"]),
    )


def check_run(task: ArtifactTask, raw_run_id: str) -> int:
    """`validateRunID`/`validateRunIDV4`."""
    try:
        run_id = int(raw_run_id)
    except ValueError:
        run_id = 0
    if run_id != task.run_id:
        raise HTTPError(400, "run-id does not match")
    return run_id


# -- rows ---------------------------------------------------------------------------------


def create_artifact(
    conn: sqlite3.Connection, task: ArtifactTask, name: str, path: str, expired_days: int, now: int
) -> Row:
    """`CreateArtifact`: the run's row for (name, path), created pending, or the existing one
    with a new expiry."""
    expired = now + 86400 * expired_days
    row = get_by_name_and_path(conn, task.run_id, name, path)
    if row is None:
        conn.execute(
            "INSERT INTO artifact (run_id, runner_id, repo_id, owner_id, commit_sha, artifact_name, artifact_path, "
            "status, created, updated, expired) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                *(task.run_id, task.runner_id, task.repo_id, task.owner_id, task.commit_sha, name, path),
                int(ArtifactStatus.UPLOAD_PENDING),
                now,
                now,
                expired,
            ),
        )
    else:
        conn.execute("UPDATE artifact SET expired = ? WHERE id = ?", (expired, row["id"]))
    created = get_by_name_and_path(conn, task.run_id, name, path)
    assert created is not None
    return created


def get_by_name_and_path(conn: sqlite3.Connection, run_id: int, name: str, path: str) -> Row | None:
    row: Row | None = conn.execute(
        "SELECT * FROM artifact WHERE run_id = ? AND artifact_name = ? AND artifact_path = ?", (run_id, name, path)
    ).fetchone()
    return row


def update_artifact(conn: sqlite3.Connection, artifact_id: int, now: int, **values: object) -> None:
    columns = ", ".join(f"{key} = ?" for key in values)
    conn.execute(f"UPDATE artifact SET {columns}, updated = ? WHERE id = ?", (*values.values(), now, artifact_id))


def find_artifacts(
    conn: sqlite3.Connection, run_id: int, *, name: str | None = None, status: int = 0, v4_only: bool = False
) -> list[Row]:
    """`FindArtifactsOptions`: by run, optionally name and status; `FinalizedArtifactsV4`
    keeps the rows whose content encoding holds a `/` (a content type: v4)."""
    sql, args = "SELECT * FROM artifact WHERE run_id = ?", list[object]([run_id])
    if name is not None:
        sql, args = sql + " AND artifact_name = ?", [*args, name]
    if status:
        sql, args = sql + " AND status = ?", [*args, status]
    if v4_only:
        sql += " AND content_encoding LIKE '%/%'"
    return list(conn.execute(sql + " ORDER BY id", args))


# -- files --------------------------------------------------------------------------------


@dataclass(slots=True)
class Chunk:
    artifact_id: int
    path: Path
    size: int
    start: int = 0
    end: int = 0  # inclusive
    name: str = ""  # v4 block id


class ArtifactFiles:
    """Gitea's `storage.ActionsArtifacts` on the local file system."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _v3_dir(self, run_id: int) -> Path:
        return self.root / "tmp-upload" / f"run-{run_id}"

    def v4_dir(self, run_id: int) -> Path:
        return self.root / "tmp-upload" / f"run-{run_id}-v4"

    def save(self, relative: Path, data: bytes) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def save_chunk_v3(
        self, run_id: int, artifact_id: int, start: int, end: int | None, data: bytes, md5: str | None
    ) -> int:
        """`saveUploadChunkV3`: the chunk's bytes must fill `start..end` and, when asked, match
        the `x-actions-results-md5` digest; otherwise nothing is kept."""
        if end is not None and len(data) != end - start + 1:
            raise ValueError(f"writtenSize {len(data)} does not match contentSize {end - start + 1}")
        if md5 is not None and base64.b64encode(hashlib.md5(data).digest()).decode() != md5:
            raise ValueError("md5 not match")
        name = f"{run_id}-{artifact_id}-{start}-{end if end is not None else 0}.chunk"
        self.save(self._v3_dir(run_id).relative_to(self.root) / name, data)
        return len(data)

    def v3_chunks(self, run_id: int) -> dict[int, list[Chunk]]:
        """`listV3UnorderedChunksMapByRunID`, grouped by artifact."""
        out: dict[int, list[Chunk]] = {}
        directory = self._v3_dir(run_id)
        for path in sorted(directory.iterdir()) if directory.is_dir() else []:
            match = _CHUNK_V3.match(path.name)
            if not match:
                continue
            _, artifact_id, start, end = (int(g) for g in match.groups())
            size = end - start + 1 if end else path.stat().st_size
            out.setdefault(artifact_id, []).append(Chunk(artifact_id, path, size, start, start + size - 1))
        return out

    def v4_blocks(self, run_id: int, artifact_id: int) -> list[Chunk]:
        directory = self.v4_dir(run_id)
        blocks = []
        for path in sorted(directory.iterdir()) if directory.is_dir() else []:
            match = _BLOCK_V4.match(path.name)
            if not match or int(match.group(2)) != artifact_id:
                continue
            size = int(match.group(3)) or path.stat().st_size
            name = base64.urlsafe_b64decode(match.group(4)).decode()
            blocks.append(Chunk(artifact_id, path, size, name=name))
        return blocks

    def merge(self, artifact: Row, chunks: list[Chunk], checksum: str = "") -> str | None:
        """`mergeChunksForArtifact`: the contiguous chunks from byte 0, if they cover the
        artifact's compressed size, stored as one file (its storage path is returned); None
        when the upload is not complete yet. A `sha256:` checksum must match."""
        chunks = sorted(chunks, key=lambda c: c.start)
        ordered, at = [], -1
        for chunk in chunks:
            if chunk.start == at + 1:
                ordered.append(chunk)
                at = chunk.end
        if at + 1 != artifact["file_compressed_size"]:
            return None
        data = b"".join(chunk.path.read_bytes() for chunk in ordered)
        extension = "chunk.gz" if artifact["content_encoding"] == CONTENT_ENCODING_V3_GZIP else "chunk"
        storage_path = f"{artifact['run_id'] % 255}/{artifact['id'] % 255}/{time.time_ns()}.{extension}"
        self.save(Path(storage_path), data)
        for chunk in chunks:
            chunk.path.unlink(missing_ok=True)
        if checksum.startswith("sha256:") and not hmac.compare_digest(
            checksum.removeprefix("sha256:"), hashlib.sha256(data).hexdigest()
        ):
            raise ValueError(f"update artifact error checksum is invalid {checksum}")
        if artifact["storage_path"]:
            (self.root / artifact["storage_path"]).unlink(missing_ok=True)
        return storage_path

    def read(self, storage_path: str) -> bytes:
        return (self.root / storage_path).read_bytes()
