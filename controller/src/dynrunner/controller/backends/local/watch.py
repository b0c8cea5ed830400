"""The local backend's watch: what changed under `<root>`, told to the reaper.

Every `WATCH_INTERVAL_S` one pass over the root directory takes a small *signature* of each
environment — the modification times of its directory and its `status/` directory (every
file the wrapper, the executor's process or a start follower records is created in one of
them, and removing the environment changes or removes them), whether its recorded
processes live (`kill(pid, 0)`, children reaped first), and whether its deadline or its
start grace has passed — and wakes the reaper for each environment whose signature changed,
appeared or disappeared. Nothing is read but the two numbers and, once per environment, its
pid files and deadline: for N idle environments a pass costs about 2N `stat`s and N
`kill`s, where the reaper's sweep it replaces read every metadata file, pid file and
`/proc/<pid>/cmdline` every second.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from dynrunner.controller.backends.local.layout import Layout, parse_time

WATCH_INTERVAL_S = 1.0

Signature = tuple[int, int, bool, bool, bool, bool]


@dataclass
class _Known:
    """What a pass remembers of one environment (read once, not every pass)."""

    deadline: datetime | None = None
    pid: int | None = None
    executor_pid: int | None = None
    signature: Signature | None = None
    read_deadline: bool = False


@dataclass
class DirectoryWatch:
    """One root directory's environments, compared pass by pass (`changes`)."""

    root: os.PathLike[str] | str
    deadline_grace: timedelta
    start_grace: timedelta
    alive: Callable[[str, int], bool]
    """Whether the process `pid` of environment `name` lives (the backend reaps its children)."""
    known: dict[str, _Known] = field(default_factory=dict)

    def note(self, name: str) -> None:
        """An environment made here: reported at the next pass, even if it is gone by then."""
        self.known.setdefault(name, _Known())

    def changes(self, now: datetime) -> list[str]:
        """The names (assignment ids) of environments that appeared, changed or vanished since
        the last pass."""
        try:
            names = {e.name for e in os.scandir(self.root) if not e.name.startswith(".") and e.is_dir()}
        except FileNotFoundError:
            names = set()
        changed = [name for name in self.known if name not in names]
        for name in changed:
            del self.known[name]
        for name in names:
            known = self.known.setdefault(name, _Known())
            signature = self._signature(Layout(Path(self.root) / name), name, known, now)
            if signature != known.signature:
                known.signature = signature
                changed.append(name)
        return changed

    def _signature(self, layout: Layout, name: str, known: _Known, now: datetime) -> Signature:
        directory, status = _mtime_ns(layout.dir), _mtime_ns(layout.ready_file.parent)
        if not known.read_deadline and layout.metadata_file.exists():
            meta = layout.read_metadata() or {}
            known.deadline, known.read_deadline = parse_time(meta.get("deadline")), True
        if known.pid is None:
            known.pid = layout.read_int(layout.pid_file)
        wrapper = known.pid is not None and self.alive(name, known.pid)
        executor = False
        if known.pid is not None and not wrapper:
            if known.executor_pid is None:
                known.executor_pid = layout.read_int(layout.executor_pid_file)
            executor = known.executor_pid is not None and self.alive(name, known.executor_pid)
        overdue = known.deadline is not None and now > known.deadline + self.deadline_grace
        start_overdue = False
        if known.pid is None:
            started = layout.started_at()
            start_overdue = started is not None and now - started > self.start_grace
        return directory, status, wrapper, executor, overdue, start_overdue


def _mtime_ns(path: os.PathLike[str] | str) -> int:
    with contextlib.suppress(OSError):
        return os.stat(path).st_mtime_ns
    return 0
