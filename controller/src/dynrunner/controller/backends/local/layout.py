"""Where the local backend keeps one environment: `<root>/<assignment-id>/`.

    assignment.pb   the executor's assignment (mode 0600; its secrets unsealed)
    metadata.json   labels, creation time, deadline, command: the environment's "labels"
    workspace/      the job's workspace; home/ and tmp/ are its HOME and TMPDIR
    status/         the executor's signals to the controller (executor-ready)
    reported/       the task state Gitea last accepted from the executor (`DYNRUNNER_STATE_FILE`),
                    apart from status/, which the watch looks at: it changes with every report
    executor.log    the executor's stdout and stderr
    pid             written by the wrapper as it starts (its pid = the process group)
    executor-pid    written by the executor's process as it starts (before it execs the executor)
    exit-status     written by the wrapper when the executor exits
    started         made (exclusively) right before the wrapper is spawned: one start only
    start-error     why the wrapper could not be spawned, if it could not

The wrapper is a few lines of POSIX shell run as the session leader of the executor's
process group, so the exit status survives a controller restart (the controller is not
the one waiting on the process then). The executor is not bound to the wrapper: when the
wrapper alone dies, the executor goes on (its pid file keeps it observable) and reports
its job itself; only its exit status is lost.

Creating builds the directory as `<root>/.creating-<id>.<random>` and renames it into place
(atomic): an environment appears whole or not at all, and of concurrent creates one wins.

Deleting renames the directory to `<root>/.deleting-<id>.<random>` first (atomic), then
removes it: an environment is either whole or gone from `list_owned`, so a deletion
interrupted half-way never leaves a half-environment for a restarted controller to misjudge.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dynrunner.proto.gitea import TaskState

METADATA_VERSION = 1
OUTPUT_TAIL_LINES = 20
OUTPUT_TAIL_BYTES = 8192

_HAS_PROC = Path("/proc/self/cmdline").exists()

DELETING = ".deleting-"
CREATING = ".creating-"

# The wrapper enters the job's cgroup ($2, when there is one) before anything else, so all
# the job starts is in it. HUP/INT/TERM only reach the wrapper as part of its group (the
# executor gets them too): the wrapper stays to record how the executor ended. The
# executor's process writes its own pid before it becomes the executor, so it stays
# observable should the wrapper be killed alone. 125: the environment could not be set up.
# At the end it steps back into the controller's cgroup and removes the job's (and the
# pool's, when it was the last): that fails while a process the job left runs in it, which
# deleting the environment then stops.
WRAPPER = """\
dir=$1 cage=$2; shift 2
fail() { echo "dynrunner: $1" >&2; echo 125 > "$dir/exit-status"; exit 125; }
if [ -n "$cage" ]; then echo $$ > "$cage" || fail "could not enter the job's cgroup"; fi
echo $$ > "$dir/pid"
cd "$dir/workspace" || fail "could not enter the job's workspace"
unset OLDPWD
trap : HUP INT TERM
/bin/sh -c 'echo $$ > "$0/executor-pid"; exec "$@"' "$dir" "$@" < /dev/null
status=$?
echo "$status" > "$dir/exit-status"
if [ -n "$cage" ]; then
  job=${cage%/*}; pool=${job%/*}
  { echo $$ > "${pool%/*}/cgroup.procs" && rmdir "$job" "$pool"; } 2> /dev/null
fi
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
    def executor_pid_file(self) -> Path:
        return self.dir / "executor-pid"

    @property
    def exit_file(self) -> Path:
        return self.dir / "exit-status"

    @property
    def status_dir(self) -> Path:
        """Where the executor leaves signals for the controller (the job's user may write it)."""
        return self.dir / "status"

    @property
    def start_file(self) -> Path:
        return self.dir / "started"

    @property
    def start_error_file(self) -> Path:
        return self.dir / "start-error"

    def started_at(self) -> datetime | None:
        """When the wrapper was (about to be) spawned; None before."""
        return _mtime(self.start_file)

    def claim_start(self) -> bool:
        """Take the one start of this environment; False if it was taken before (by another
        follower, or a controller before this one)."""
        try:
            os.close(os.open(self.start_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return False
        return True

    @property
    def reported_dir(self) -> Path:
        return self.dir / "reported"

    @property
    def state_file(self) -> Path:
        """The executor's accepted task state (`DYNRUNNER_STATE_FILE`), replaced on each report."""
        return self.reported_dir / "accepted-state.pb"

    def reported(self) -> TaskState | None:
        """What the executor last had accepted by Gitea; None when it left nothing readable."""
        try:
            return TaskState.decode(self.state_file.read_bytes())
        except (OSError, ValueError):
            return None

    @property
    def ready_file(self) -> Path:
        """Created by the executor once it reached Gitea (`DYNRUNNER_READY_FILE`)."""
        return self.status_dir / "executor-ready"

    def ready_at(self) -> datetime | None:
        return _mtime(self.ready_file)

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


def _mtime(path: Path) -> datetime | None:
    """When `path` was made; lstat: a job's user may put a symlink in its status directory."""
    try:
        return datetime.fromtimestamp(path.lstat().st_mtime, UTC)
    except (FileNotFoundError, NotADirectoryError):
        return None


def owned_by(pid: int, layout: Layout) -> bool:
    """Whether `pid` is alive and is this environment's wrapper or executor (not a recycled
    pid): one of its arguments is the environment's directory or a path inside it."""
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
    path = str(layout.dir).encode()
    return any(arg == path or arg.startswith(path + b"/") for arg in cmdline.split(b"\0"))


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


def to_trash(layout: Layout) -> Path | None:
    """Take an environment out of sight in one step (a rename to a `.deleting-` name); the
    renamed directory, or None if there was none. Remove it with `remove_tree`."""
    target = layout.dir.parent / f"{DELETING}{layout.dir.name}.{uuid.uuid4().hex[:8]}"
    try:
        os.rename(layout.dir, target)
    except FileNotFoundError:
        return None
    return target


def trashed(root: Path) -> list[Path]:
    """Directories being deleted, or whose deletion was interrupted (the controller died)."""
    try:
        return [Path(e.path) for e in os.scandir(root) if e.name.startswith(DELETING) and e.is_dir()]
    except FileNotFoundError:
        return []


def remove_tree(path: Path) -> None:
    """`rm -rf path`, also through directories a job made unreadable or unwritable (mode 000),
    which stop a controller that is not root: their modes are restored and it tries again."""
    try:
        shutil.rmtree(path)
        return
    except FileNotFoundError:
        return
    except PermissionError:
        pass
    _writable_dir(str(path))
    for top, dirs, _ in os.walk(path):
        for name in dirs:
            _writable_dir(os.path.join(top, name))
    shutil.rmtree(path)


def _writable_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.chmod(path, 0o700)
