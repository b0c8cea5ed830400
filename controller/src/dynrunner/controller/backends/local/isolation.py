"""Keeping a job away from the controller's secrets and from the other jobs (`runAsUser`).

A controller running as root starts each executor as the unprivileged `runAsUser` inside
mount, PID and IPC namespaces of its own, made by a small shell that runs as root in them
before it drops to that user:

* every path the configuration names (the state directory with the sealing key, the NATS
  store and its credentials, the job roots of every pool, the registration token file, key
  and credential files) and the configuration file itself are covered — directories by an
  empty read-only tmpfs, files by a root-owned file of mode 000 — then the job's own
  directory (and a `Filesystem` artifact store) is shown again at its usual path;
* `/tmp`, `/var/tmp` and `/dev/shm` are private to the job (fresh tmpfs), so nothing a job
  leaves there reaches another;
* the job gets its own `/proc`: it sees only its own processes (not the controller's command
  line, not another job's environment or arguments);
* the executor runs under `setpriv` as that user and group, with no supplementary groups,
  no capabilities and `no_new_privs` (setuid programs such as `sudo` cannot give it root,
  which would undo all of the above).

Why one user for every job rather than a user per job: the namespaces already separate
concurrent jobs (a job sees neither another job's directory nor its processes, and its
temporary directories are its own), while one user keeps a shared `Filesystem` artifact
store writable by every job and needs no passwd entries. What jobs of one pool still share is
what that user may write outside the job's view — so use a dedicated user that owns nothing
(its home directory, if any, is hidden too) — and the network.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from dynrunner.controller.backends.local.containment import probe
from dynrunner.controller.backends.local.layout import Layout

NAMESPACES = ("--mount", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc", "--propagation", "private")
"""`unshare`'s options for a job's namespaces."""
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
JOB_DIR_MODE = 0o750
ASSIGNMENT_MODE = 0o440

# Runs as root, as the first process of the job's mount/PID/IPC namespaces. Arguments: the
# job's directory, the blank file, the artifact store to show (or ""), the paths to hide,
# "--", then the command (setpriv … executor …). It holds the job's directory (fd 3), the
# store (fd 4) and the blank file (fd 5) open while what contains them is covered, and binds
# them through /proc (with `mount -c`: a canonicalized path would name the cover, not what
# lies under it). It runs the executor as its child, so it reaps the namespace's orphans,
# and records the exit status (which outlives a wrapper killed alone); when it exits, the
# kernel ends the namespace and everything left in it.
SANDBOX_INIT = """\
dir=$1 blank=$2 store=$3; shift 3
fail() {
  echo "dynrunner: $1" >&2
  { echo 125 > /proc/self/fd/3/exit-status || echo 125 > "$dir/exit-status"; } 2> /dev/null
  exit 125
}
exec 3< "$dir" || fail "cannot open the job's directory"
exec 5< "$blank" || fail "cannot open $blank"
if [ -n "$store" ]; then exec 4< "$store" || fail "cannot open the artifact store $store"; fi
while [ "$1" != -- ]; do
  if [ -d "$1" ]; then
    mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev,noexec dynrunner-hidden "$1" || fail "cannot hide $1"
  elif [ -e "$1" ]; then
    mount -c --bind /proc/self/fd/5 "$1" || fail "cannot hide $1"
  fi
  shift
done
shift
for tmp in /tmp /var/tmp /dev/shm; do
  [ ! -d "$tmp" ] || mount -t tmpfs -o mode=1777,nosuid,nodev dynrunner-tmp "$tmp" || fail "cannot make $tmp private"
done
show() { mkdir -p "$2" && mount -c --bind "/proc/self/fd/$1" "$2"; }
show 3 "$dir" || fail "cannot show the job its directory"
if [ -n "$store" ]; then show 4 "$store" || fail "cannot show the job the artifact store"; fi
exec 3<&- 4<&- 5<&-
"$@"
status=$?
echo "$status" > "$dir/exit-status"
exit "$status"
"""


class IsolationError(RuntimeError):
    """`runAsUser` cannot be honoured here (the message says why)."""


@dataclass(frozen=True, slots=True)
class RunAs:
    uid: int
    gid: int
    name: str
    home: str = ""

    def __str__(self) -> str:
        return f"{self.name} (uid {self.uid}, gid {self.gid})"


def resolve_user(user: str | int, group: str | int | None) -> RunAs:
    """The uid and gid of a user and group given by name or number. A uid without a passwd
    entry is allowed (its group defaults to the same number)."""
    entry = None
    if isinstance(user, int) or user.isdigit():
        uid = int(user)
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            entry = None
    else:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise IsolationError(f"runAsUser {user!r} is no user on this machine") from None
        uid = entry.pw_uid
    if uid == 0:
        raise IsolationError("runAsUser must not be root: jobs would hold every power of the controller")
    if group is None:
        gid = entry.pw_gid if entry is not None else uid
    elif isinstance(group, int) or group.isdigit():
        gid = int(group)
    else:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise IsolationError(f"runAsGroup {group!r} is no group on this machine") from None
    if gid == 0:
        raise IsolationError("runAsGroup must not be root's group")
    name = entry.pw_name if entry is not None else str(uid)
    home = entry.pw_dir if entry is not None else ""
    return RunAs(uid, gid, name, home)


def configured_paths(config: BaseModel) -> set[Path]:
    """Every path the controller's configuration names (its state, stores, keys, token and
    credential files, job roots): the controller's, none of them a job's business."""
    found: set[Path] = set()

    def walk(value: object) -> None:
        if isinstance(value, Path):
            found.add(value)
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(config)
    return found


@dataclass(frozen=True, slots=True)
class Sandbox:
    run_as: RunAs
    hidden: tuple[str, ...]
    """Files and directories covered in the job's view (outermost first)."""
    blank: str
    """A root-owned file of mode 000: what a hidden file shows."""
    store: str
    """A Filesystem artifact store to show again should a hidden path cover it ("" for none)."""
    unshare: str
    setpriv: str

    def command_prefix(self, job_dir: Path) -> list[str]:
        return [
            self.unshare,
            *NAMESPACES,
            "--",
            "/bin/sh",
            "-c",
            SANDBOX_INIT,
            "dynrunner-sandbox",
            str(job_dir),
            self.blank,
            self.store,
            *self.hidden,
            "--",
            self.setpriv,
            f"--reuid={self.run_as.uid}",
            f"--regid={self.run_as.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]

    def hand_over(self, layout: Layout) -> None:
        """Give the job's user what it needs of its directory and nothing more: it may read
        its assignment and write its workspace, HOME, TMPDIR and status directory; it may
        not write the directory itself (where the wrapper records pids and the exit status)."""
        uid, gid = self.run_as.uid, self.run_as.gid
        os.chown(layout.dir, 0, gid)
        os.chmod(layout.dir, JOB_DIR_MODE)
        os.chown(layout.assignment_file, 0, gid)
        os.chmod(layout.assignment_file, ASSIGNMENT_MODE)
        for sub in (layout.workspace, layout.home, layout.tmp, layout.status_dir, layout.reported_dir):
            os.chown(sub, uid, gid)

    def describe(self) -> str:
        return (
            f"jobs run as {self.run_as} in mount, PID and IPC namespaces of their own, without privileges; "
            "the controller's state, configuration, keys and token are hidden from them"
        )


def require_root_controller() -> None:
    """runAsUser is possible only for a root controller; checked before anything is made for
    the jobs' user, so that a normal user's controller says this rather than fail a chown."""
    if os.geteuid() != 0:
        raise IsolationError(
            f"runAsUser needs the controller to run as root (it runs as uid {os.geteuid()}); "
            "remove runAsUser, or start the controller as root"
        )


def sandbox(
    run_as: RunAs,
    *,
    controller_paths: set[Path],
    config_file: Path | None,
    root_dir: Path,
    executor: str,
    store: str,
) -> Sandbox:
    """Check that jobs can be isolated here as `run_as`, and how. Raises IsolationError."""
    require_root_controller()
    tools = {name: shutil.which(name) for name in ("unshare", "setpriv", "mount")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise IsolationError(f"runAsUser needs {', '.join(missing)} (util-linux), which is not installed")
    paths = set(controller_paths)
    if config_file is not None:
        paths.add(config_file)
    if run_as.home not in ("", "/") and not root_dir.is_relative_to(run_as.home):
        paths.add(Path(run_as.home))
    hidden = _outermost(p.absolute() for p in paths)
    program = Path(executor).resolve()
    for path in [*hidden, *map(Path, PRIVATE_TMP)]:
        if program.is_relative_to(path):
            raise IsolationError(
                f"the executor {program} lies in {path}, which jobs must not see (the controller's own files); "
                "install it elsewhere"
            )
    blank = root_dir / ".blank"
    if not blank.exists():
        blank.touch(mode=0o000)
    os.chmod(blank, 0o000)
    _probe(tools["unshare"] or "", root_dir)
    return Sandbox(
        run_as,
        tuple(str(p) for p in hidden),
        str(blank),
        store,
        tools["unshare"] or "",
        tools["setpriv"] or "",
    )


def _outermost(paths: object) -> list[Path]:
    """The paths, without those inside another one, shortest first."""
    ordered = sorted(set(paths), key=lambda p: (len(p.parts), str(p)))  # type: ignore[call-overload]
    kept: list[Path] = []
    for path in ordered:
        if path != Path("/") and not any(path.is_relative_to(outer) for outer in kept):
            kept.append(path)
    return kept


def _probe(unshare: str, root_dir: Path) -> None:
    """Make the namespaces and one mount in them, as each job will."""
    failed = probe(
        [unshare, *NAMESPACES, "--", "/bin/sh", "-c", 'mount -t tmpfs dynrunner-probe "$1"', "sh", str(root_dir)]
    )
    if failed:
        raise IsolationError(
            f"runAsUser: cannot create a job's namespaces here (a container without CAP_SYS_ADMIN?): {failed}"
        )


def unisolated_warning(config_file: Path | None) -> str:
    """What a job can do when it runs as the controller's own user (no runAsUser)."""
    uid = os.geteuid()
    who = "root" if uid == 0 else f"uid {uid}"
    remedy = (
        "set backend.runAsUser to run them as an unprivileged user in namespaces of their own"
        if uid == 0
        else "isolating them (backend.runAsUser) needs a controller running as root"
    )
    config = f" ({config_file})" if config_file is not None else ""
    return (
        f"jobs run as the controller's own user ({who}) and are not isolated from it: a job can read the "
        f"configuration{config}, the registration token, the sealing key, the NATS store and other jobs' "
        f"directories; {remedy}"
    )
