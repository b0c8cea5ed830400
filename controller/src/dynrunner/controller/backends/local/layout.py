"""Where the local backend keeps one environment: `<root>/<assignment-id>/`.

    assignment.pb   the executor's assignment (mode 0600; its secrets unsealed)
    metadata.json   labels, creation time, deadline, command: the environment's "labels"
    workspace/      the job's workspace; home/ and tmp/ are its HOME and TMPDIR
    executor.log    the executor's stdout and stderr
    pid             written by the wrapper as it starts (its pid = the process group)
    exit-status     written by the wrapper when the executor exits

The wrapper is a few lines of POSIX shell run as the session leader of the executor's
process group, so the exit status survives a controller restart (the controller is not
the one waiting on the process then).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

METADATA_VERSION = 1
OUTPUT_TAIL_LINES = 20
OUTPUT_TAIL_BYTES = 8192

_HAS_PROC = Path("/proc/self/cmdline").exists()

WRAPPER = """\
dir=$1; shift
echo $$ > "$dir/pid"
cd "$dir/workspace" || exit 125
unset OLDPWD
"$@" < /dev/null
status=$?
echo "$status" > "$dir/exit-status"
exit "$status"
"""


@dataclass(frozen=True, slots=True)
class Layout:
    dir: Path

    @property
    def assignment_file(self) -> Path:
        return self.dir / "assignment.pb"

    @property
    def metadata_file(self) -> Path:
        return self.dir / "metadata.json"

    @property
    def workspace(self) -> Path:
        return self.dir / "workspace"

    @property
    def home(self) -> Path:
        return self.dir / "home"

    @property
    def tmp(self) -> Path:
        return self.dir / "tmp"

    @property
    def output(self) -> Path:
        return self.dir / "executor.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / "pid"

    @property
    def exit_file(self) -> Path:
        return self.dir / "exit-status"

    @property
    def ready_file(self) -> Path:
        """Created by the executor once it reached Gitea (`DYNRUNNER_READY_FILE`)."""
        return self.dir / "executor-ready"

    def ready_at(self) -> datetime | None:
        try:
            return datetime.fromtimestamp(self.ready_file.stat().st_mtime, UTC)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_int(self, path: Path) -> int | None:
        """An integer the wrapper wrote, None while absent (or half-written)."""
        try:
            return int(path.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def read_metadata(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.metadata_file.read_text())
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("version") == METADATA_VERSION else None

    def write_metadata(self, data: dict[str, Any]) -> None:
        """Atomically, so a reader sees either no metadata or all of it."""
        tmp = self.dir / ".metadata.json.tmp"
        tmp.write_text(json.dumps({"version": METADATA_VERSION, **data}, indent=2, sort_keys=True))
        os.replace(tmp, self.metadata_file)

    def write_secret(self, data: bytes) -> None:
        fd = os.open(self.assignment_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def output_tail(self) -> str:
        """The last lines of the executor's output, for a diagnosis."""
        try:
            with self.output.open("rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - OUTPUT_TAIL_BYTES))
                text = f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        lines = text.splitlines()
        if size > OUTPUT_TAIL_BYTES and lines:
            lines = lines[1:]
        return "\n".join(lines[-OUTPUT_TAIL_LINES:])


def owned_by(pid: int, layout: Layout) -> bool:
    """Whether `pid` is alive and is this environment's wrapper (not a recycled pid)."""
    if not _HAS_PROC:
        return _signalable(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return _signalable(pid)
    if not cmdline:
        return False  # a zombie: exited, not reaped yet
    return str(layout.dir).encode() in cmdline.split(b"\0")


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parse_time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None
