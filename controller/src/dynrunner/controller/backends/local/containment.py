"""How the local backend holds every process of a job, so that none outlives the job.

A step may leave processes behind that neither stay in the wrapper's process group nor keep
`RUNNER_TRACKING_ID` (`env -i setsid …`, a double fork, `sudo` with its environment reset).
The backend contains them with the best mechanism this machine offers, chosen at start
(`containment: auto`) or named in the configuration:

* `cgroup-v2`: each job in a cgroup of its own below the controller's cgroup; deleting
  writes `cgroup.kill` (or freezes it and kills every member, before Linux 5.14). Nothing a
  job starts leaves its cgroup unless it may write the cgroups above it (only root can).
* `cgroup-v1`: the same in the v1 `freezer` hierarchy: freeze, kill every member, thaw.
* `pid-namespace`: each job in a PID namespace of its own (`unshare --pid --fork
  --kill-child --mount-proc`), whose first process is a shell that runs the executor and
  records how it ended; when that shell exits, the kernel kills everything left in the
  namespace. Needs root. The job sees only its own processes.
* `process-scan`: best effort, what remains: the wrapper's process group, the processes
  descending from it, and those carrying the job's `RUNNER_TRACKING_ID`. The three
  techniques above escape it.

Each environment records where its processes are held (`Cage`, in its metadata), so a
controller restarted with other settings still stops the jobs an earlier run started.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
PROBE = ".probe-"
"""The cgroup a probe moves a process into: `.probe-<pid>`, a name no job has (a job's
cgroup is named by its assignment id, which never starts with a dot)."""
PROBE_AGE_S = 60.0
"""A probe is over within `PROBE_TIMEOUT_S`; a probe cgroup older than this was left by a
process killed during its probe."""
FREEZE_WAIT_S = 2.0

# The first process of a job's PID namespace: it runs the executor (so that it is not PID 1,
# which ignores signals it has no handler for, and has orphans to reap), records its status
# as the wrapper does (it stays when the wrapper is killed alone) and ends the namespace.
NAMESPACE_INIT = """\
dir=$1; shift
"$@"
status=$?
echo "$status" > "$dir/exit-status"
exit "$status"
"""


class Kind(enum.StrEnum):
    CGROUP_V2 = "cgroup-v2"
    CGROUP_V1 = "cgroup-v1"
    PID_NAMESPACE = "pid-namespace"
    PROCESS_SCAN = "process-scan"


PREFERENCE = (Kind.CGROUP_V2, Kind.CGROUP_V1, Kind.PID_NAMESPACE, Kind.PROCESS_SCAN)


class Unavailable(Exception):
    """This containment cannot be used here (the message says why)."""


@dataclass(frozen=True, slots=True)
class Cage:
    """Where one job's processes are held, as recorded in its metadata."""

    kind: Kind
    cgroup: str = ""

    def record(self) -> dict[str, str]:
        return {"kind": self.kind.value, "cgroup": self.cgroup}

    @classmethod
    def from_record(cls, data: object) -> Cage:
        """The cage an environment's metadata names (process-scan for metadata of older versions)."""
        if not isinstance(data, Mapping):
            return cls(Kind.PROCESS_SCAN)
        try:
            kind = Kind(str(data.get("kind")))
        except ValueError:
            return cls(Kind.PROCESS_SCAN)
        return cls(kind, str(data.get("cgroup") or ""))

    @property
    def join_file(self) -> str:
        """The file the wrapper writes its pid to before anything else, or "" for none."""
        return f"{self.cgroup}/cgroup.procs" if self.cgroup else ""

    def make(self) -> None:
        """Make the cgroup (and the pool's, above it). Only once the job's directory is in
        place: orphan collection, of any replica or process sharing the root, keeps the
        cgroups whose directory exists and takes every other for a leftover (`leftovers`)."""
        if not self.cgroup:
            return
        for attempt in range(3):
            try:
                os.makedirs(self.cgroup, exist_ok=True)
                return
            except FileNotFoundError:  # the pool's cgroup was just removed with the last job's
                if attempt == 2:
                    raise

    def members(self) -> set[int] | None:
        """The processes in the job's cgroup and any cgroup the job made below it; None
        without a cgroup (or when it is gone: after a reboot, say)."""
        if not self.cgroup or not os.path.isdir(self.cgroup):
            return None
        found: set[int] = set()
        for directory in _cgroup_tree(self.cgroup):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(line) for line in Path(directory, "cgroup.procs").read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL everything in the cgroup at once: no member can fork past the kill."""
        if not self.cgroup:
            return
        top = Path(self.cgroup)
        if not top.exists():
            return
        if self.kind is Kind.CGROUP_V2 and (top / "cgroup.kill").exists():
            _write(top / "cgroup.kill", "1")
            return
        if self.kind is Kind.CGROUP_V2:
            with _frozen(top / "cgroup.freeze", "1", "0", None):
                self._kill_each()
        else:
            with _frozen(top / "freezer.state", "FROZEN", "THAWED", top / "freezer.state"):
                self._kill_each()

    def release(self) -> None:
        """Remove the (empty) cgroup and those the job made inside it, and the parent when it
        was the last (the controller leaves no empty cgroups behind)."""
        if not self.cgroup:
            return
        deadline = time.monotonic() + 2.0
        for directory in reversed(_cgroup_tree(self.cgroup)):
            while True:
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:  # EBUSY: the last member is still exiting
                    if time.monotonic() > deadline:
                        log.warning("cgroup %s could not be removed: %s", directory, err)
                        return
                    time.sleep(0.02)
        with contextlib.suppress(OSError):  # not empty: other jobs run
            os.rmdir(os.path.dirname(self.cgroup))

    def _kill_each(self) -> None:
        for pid in self.members() or ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _frozen(control: Path, freeze: str, thaw: str, state: Path | None):  # type: ignore[no-untyped-def]
    """Freeze a cgroup for the block (a frozen member cannot fork), then thaw it."""
    _write(control, freeze)
    if state is not None:
        deadline = time.monotonic() + FREEZE_WAIT_S
        while state.read_text().strip() != freeze and time.monotonic() < deadline:
            time.sleep(0.01)
    try:
        yield
    finally:
        _write(control, thaw)


def _write(path: Path, value: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.write_text(value)


def _cgroup_tree(top: str) -> list[str]:
    """`top` and every cgroup below it, parents before children."""
    found = []
    for directory, _, _ in os.walk(top):
        found.append(directory)
    return found


@dataclass(frozen=True, slots=True)
class Containment:
    """The mechanism this backend puts new jobs in."""

    kind: Kind
    parent: Path | None = None
    """The cgroup below which each job gets its own (cgroup kinds)."""
    unshare: str = ""
    """The `unshare` program (pid-namespace)."""
    passed_over: tuple[str, ...] = ()
    """Why each better mechanism was not chosen, for the log and `check`."""

    def cage(self, assignment_id: str) -> Cage:
        """The place for a new job (its cgroup's path, made by `Cage.make` as the job starts)."""
        if self.parent is None:
            return Cage(self.kind)
        return Cage(self.kind, str(self.parent / assignment_id))

    def command_prefix(self, job_dir: Path) -> list[str]:
        """What the executor's command runs inside (the PID namespace and its first process)."""
        if self.kind is not Kind.PID_NAMESPACE:
            return []
        return [
            self.unshare,
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--",
            "/bin/sh",
            "-c",
            NAMESPACE_INIT,
            "dynrunner-init",
            str(job_dir),
        ]

    def leftovers(self, keep: Callable[[str], bool]) -> list[str]:
        """Kill and remove the cgroups of jobs whose environment is gone (`keep(name)` false).
        Safe against launches in progress in any process without a lock or an age: a job's
        cgroup is made only while its directory exists (`Cage.make`), so one seen without
        its directory was made for an environment that was removed since. A probe's cgroup
        (another process starting, or `check`) is left alone until it is `PROBE_AGE_S` old."""
        if self.parent is None:
            return []
        removed = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.parent):
                if not entry.is_dir():
                    continue
                if entry.name.startswith(PROBE):  # another process's probe, unless long over
                    with contextlib.suppress(FileNotFoundError):
                        if time.time() - entry.stat().st_mtime < PROBE_AGE_S:
                            continue
                    why = "the cgroup of an interrupted probe"
                elif keep(entry.name):
                    continue
                else:
                    why = "the cgroup of a job that is gone"
                cage = Cage(self.kind, entry.path)
                cage.kill()
                cage.release()
                removed.append(f"{entry.path} ({why})")
        return removed

    def describe(self) -> str:
        where = f" below {self.parent}" if self.parent is not None else ""
        text = f"processes contained by {self.kind.value}{where}"
        if self.kind is Kind.PROCESS_SCAN:
            text += " (best effort: a process that leaves the job's process tree and environment escapes it)"
        return text


def choose(requested: str, root_dir: Path, pool: str) -> Containment:
    """The best containment available for jobs under `root_dir` (`auto`), or the one named;
    raises ValueError when a named one is not available, saying why."""
    order = PREFERENCE if requested == "auto" else (Kind(requested),)
    passed_over: list[str] = []
    for kind in order:
        try:
            found = _probe(kind, root_dir, pool)
        except Unavailable as why:
            passed_over.append(f"{kind.value}: {why}")
            continue
        return Containment(found.kind, found.parent, found.unshare, tuple(passed_over))
    raise ValueError(f"containment {requested} is not available: {'; '.join(passed_over)}")


def _probe(kind: Kind, root_dir: Path, pool: str) -> Containment:
    if kind is Kind.PROCESS_SCAN:
        return Containment(kind)
    if kind is Kind.PID_NAMESPACE:
        return Containment(kind, unshare=_probe_pid_namespace())
    parent = _cgroup_parent(kind, root_dir, pool)
    _probe_cgroup(parent)
    return Containment(kind, parent)


def _probe_pid_namespace() -> str:
    if os.geteuid() != 0:
        raise Unavailable("needs the controller to run as root")
    unshare = shutil.which("unshare")
    if unshare is None:
        raise Unavailable("unshare (util-linux) is not installed")
    failed = probe([unshare, "--pid", "--fork", "--kill-child", "--mount-proc", "--", "/bin/true"])
    if failed:
        raise Unavailable(f"unshare failed: {failed}")
    return unshare


def probe(argv: list[str]) -> str:
    """Run a probe command: "" when it worked, else why not (the last line it printed)."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if done.returncode == 0:
        return ""
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"status {done.returncode}"


def _cgroup_parent(kind: Kind, root_dir: Path, pool: str) -> Path:
    """`<mount><controller's own cgroup>/dynrunner-<pool>-<hash of rootDir>`: below the
    controller's cgroup (where it may create cgroups: all of it as root, a delegated subtree
    otherwise), and one per job root, so controllers sharing a machine never touch each
    other's jobs."""
    mount, own = _own_cgroup(kind)
    digest = hashlib.sha256(str(root_dir.absolute()).encode()).hexdigest()[:12]
    return Path(mount) / own.lstrip("/") / f"dynrunner-{pool}-{digest}"


def _own_cgroup(kind: Kind) -> tuple[str, str]:
    """The hierarchy's mount point and this process's cgroup in it."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as err:
        raise Unavailable(f"cannot read /proc: {err}") from None
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        tail = fields[fields.index("-") + 1 :]
        fstype, options = tail[0], tail[2].split(",") if len(tail) > 2 else []
        if kind is Kind.CGROUP_V2 and fstype == "cgroup2":
            own = next((m.split(":", 2)[2] for m in memberships if m.startswith("0::")), None)
            if own is not None:
                return fields[4], own
        if kind is Kind.CGROUP_V1 and fstype == "cgroup" and "freezer" in options:
            own = next((m.split(":", 2)[2] for m in memberships if "freezer" in m.split(":", 2)[1].split(",")), None)
            if own is not None:
                return fields[4], own
    raise Unavailable("no cgroup2 mount" if kind is Kind.CGROUP_V2 else "no cgroup v1 freezer hierarchy")


def _probe_cgroup(parent: Path) -> None:
    """Create the parent, and check that a process can move itself into a cgroup below it
    (what the wrapper does) and be killed there."""
    probe_dir = parent / f"{PROBE}{os.getpid()}"
    try:
        probe_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise Unavailable(f"cannot create {probe_dir}: {err.strerror or err}") from None
    try:
        failed = probe(["/bin/sh", "-c", 'echo $$ > "$1"', "sh", str(probe_dir / "cgroup.procs")])
        if failed:
            raise Unavailable(f"cannot move a process into {probe_dir}: {failed}")
    finally:
        Cage(Kind.CGROUP_V2, str(probe_dir)).release()
