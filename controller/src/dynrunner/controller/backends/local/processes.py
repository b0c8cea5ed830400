"""Finding every process of one local environment, so deleting it leaves nothing running.

The executor runs each step in a session of its own, and a step may leave background
processes behind; none of them stays in the wrapper's process group. Like GitHub's runner,
the environment marks its processes with `RUNNER_TRACKING_ID` (inherited by every step and
whatever a step starts); a process carrying the environment's id, or descending from its
wrapper, belongs to it. Linux only (`/proc`); elsewhere only the wrapper's group is known.

Reading `/proc` costs a few milliseconds, so one snapshot serves every deletion of a
reaper sweep (`ProcessTable.snapshot(max_age_s)`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

TRACKING_VAR = "RUNNER_TRACKING_ID"
_MARKER = TRACKING_VAR.encode() + b"="


def tracking_id(assignment_id: str) -> str:
    return f"dynrunner_{assignment_id}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    parents: dict[int, int] = field(default_factory=dict)
    tracking: dict[int, str] = field(default_factory=dict)

    def belonging(self, tracking: str, roots: Collection[int] = ()) -> set[int]:
        """Live pids carrying `tracking`, or descending from one of `roots`."""
        found = {pid for pid, value in self.tracking.items() if value == tracking}
        roots = [pid for pid in roots if pid in self.parents]
        if roots:
            children: dict[int, list[int]] = {}
            for pid, parent in self.parents.items():
                children.setdefault(parent, []).append(pid)
            stack = list(roots)
            while stack:
                pid = stack.pop()
                if pid not in found:
                    found.add(pid)
                    stack.extend(children.get(pid, ()))
        found.discard(os.getpid())
        return found


class ProcessTable:
    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._taken = 0.0
        self.available = os.path.isdir("/proc/self")

    def cached(self, max_age_s: float = 1.0) -> Snapshot | None:
        """The last snapshot if it is at most `max_age_s` old."""
        if self._snapshot is not None and time.monotonic() - self._taken <= max_age_s:
            return self._snapshot
        return None

    def snapshot(self, max_age_s: float = 1.0) -> Snapshot:
        now = time.monotonic()
        if self._snapshot is None or now - self._taken > max_age_s:
            self._snapshot = _read() if self.available else Snapshot()
            self._taken = time.monotonic()
        return self._snapshot


def _read() -> Snapshot:
    snap = Snapshot()
    for pid in _pids():
        stat = _read_file(f"/proc/{pid}/stat")
        if stat is None:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2 or fields[0] == b"Z":
            continue  # a zombie is already dead
        snap.parents[pid] = int(fields[1])
        environ = _read_file(f"/proc/{pid}/environ")
        if environ and _MARKER in environ:
            for item in environ.split(b"\0"):
                if item.startswith(_MARKER):
                    snap.tracking[pid] = item[len(_MARKER) :].decode(errors="replace")
                    break
    return snap


def _read_file(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 20)
    except OSError:
        return None
    finally:
        os.close(fd)


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)
