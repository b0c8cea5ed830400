"""Task logs: Gitea's UpdateLog ack arithmetic and its row storage format.

Sources: Gitea `routers/api/actions/runner/runner.go` `UpdateLog` (G-0715, after PR #37631)
and `modules/actions/log.go` (`WriteLogs`, `TransferLogs`, `FormatLog`, `ParseLog`).
Rows are appended to a "DBFS" file while the task runs and moved to "storage" when the
runner says `no_more` (archived); rows are `<RFC 3339 UTC, 7 fractional digits> <content>`
with newlines in the content escaped as the two characters backslash-n and content cut
at 64 KiB.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dynrunner.doubles.gitea import tasks
from dynrunner.doubles.gitea.errors import NOT_EXIST, RpcStatus, internal

MAX_LINE_SIZE = 64 * 1024


def format_row(seconds: int, nanos: int, content: str) -> bytes:
    stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    escaped = content.replace("\n", "\\n").encode()[:MAX_LINE_SIZE]
    return f"{stamp}.{nanos // 100:07d}Z ".encode() + escaped


class LogFiles:
    """The DBFS (unfinished) and storage (archived) halves of Gitea's log storage."""

    def __init__(self, root: Path) -> None:
        self.dbfs = root / "dbfs"
        self.storage = root / "storage"

    def write(self, filename: str, offset: int, rows: Sequence[bytes]) -> list[int]:
        """`WriteLogs`: only the first write (offset 0) may create the file."""
        path = self.dbfs / filename
        if offset == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)
        elif not path.exists():
            raise FileNotFoundError(f'dbfs.OpenFile "actions_log/{filename}" for write-only: file does not exist')
        if path.stat().st_size < offset:
            raise OSError(f'size of "actions_log/{filename}" is less than offset')
        sizes = []
        with path.open("r+b") as handle:
            handle.seek(offset)
            for row in rows:
                line = row + b"\n"
                handle.write(line)
                sizes.append(len(line))
        return sizes

    def transfer(self, filename: str) -> None:
        """`TransferLogs`: fails (the caller decides what that means) when nothing was written."""
        source = self.dbfs / filename
        if not source.exists():
            raise FileNotFoundError(f'dbfs.Open "actions_log/{filename}": file does not exist')
        target = self.storage / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(source, target)

    def read(self, filename: str, in_storage: bool) -> list[tuple[str, str]]:
        """(timestamp, stored content) per row; content keeps its escaping, as `ReadLogs`."""
        path = (self.storage if in_storage else self.dbfs) / filename
        if not path.exists():
            return []
        rows = []
        for line in path.read_bytes().split(b"\n")[:-1]:
            text = line.decode(errors="replace").removesuffix("\r")
            stamp, _, content = text.partition(" ")
            rows.append((stamp, content))
        return rows


def update_log(
    conn: sqlite3.Connection, files: LogFiles, runner_id: int, req: Any, now: int, *, legacy_empty_no_more: bool
) -> int:
    """One UpdateLog call inside a write transaction; returns the ack index."""
    task = tasks.get_task(conn, req.task_id)
    if task is None:
        raise internal(f"get task: task with id {req.task_id}: {NOT_EXIST}")
    if task["runner_id"] != runner_id:
        raise internal("invalid runner for task")
    ack = int(task["log_length"])
    index = int(req.index)
    count = len(req.rows)
    if legacy_empty_no_more:
        # Before go-gitea/gitea#37631: nothing new → return early, even for no_more.
        if count == 0 or index > ack or index + count <= ack:
            return ack
        if task["log_in_storage"]:
            raise RpcStatus("AlreadyExists", "log file has been archived")
        rows = list(req.rows)[ack - index :]
    else:
        rows = list(req.rows)[ack - index :] if index <= ack < index + count else []
        if task["log_in_storage"]:
            if rows:
                raise RpcStatus("AlreadyExists", "log file has been archived")
            return ack
        if not rows and (not req.no_more or index > ack):
            return ack
    encoded = [format_row(r.time.seconds, r.time.nanos, r.content) for r in rows]
    try:
        sizes = files.write(task["log_filename"], int(task["log_size"]), encoded)
    except OSError as exc:
        raise internal(f"unable to append logs to dbfs file: {exc}") from exc
    offsets = []
    size = int(task["log_size"])
    for n in sizes:
        offsets.append(size)
        size += n
    length = ack + len(rows)
    in_storage = int(task["log_in_storage"])
    if req.no_more:
        in_storage = 1
        try:
            files.transfer(task["log_filename"])
        except OSError as exc:
            raise internal(f"transfer logs: {exc}") from exc
    conn.execute(
        "UPDATE task SET log_indexes = ?, log_length = ?, log_size = ?, log_in_storage = ?, updated = ? WHERE id = ?",
        (appended_indexes(task["log_indexes"], offsets), length, size, in_storage, now, task["id"]),
    )
    return length


def appended_indexes(indexes: str, offsets: Sequence[int]) -> str:
    """The JSON list `indexes` with `offsets` appended, as text: parsing and re-serializing the
    whole list on every call made UpdateLog cost grow with the log."""
    if not offsets:
        return indexes
    tail = ",".join(map(str, offsets))
    return f"[{tail}]" if indexes == "[]" else f"{indexes[:-1]},{tail}]"


def archive_after_stop(conn: sqlite3.Connection, files: LogFiles, task_id: int, now: int) -> bool:
    """The reaper's `TransferLogs` + `log_in_storage`; skipped when no log was ever written."""
    task = tasks.get_task(conn, task_id)
    if task is None or task["log_in_storage"]:
        return False
    try:
        files.transfer(task["log_filename"])
    except OSError:
        return False
    conn.execute("UPDATE task SET log_in_storage = 1, updated = ? WHERE id = ?", (now, task_id))
    return True
