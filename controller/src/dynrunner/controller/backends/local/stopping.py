"""Stopping every process of one environment: SIGTERM, a grace period, then SIGKILL.

Which processes belong to the job depends on where they are held (`containment.Cage`): the
members of its cgroup, or — in a PID namespace, or with the best-effort scan — the
processes descending from its wrapper and executor and those carrying its tracking id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Collection

from dynrunner.controller.backends.local.containment import Cage
from dynrunner.controller.backends.local.processes import ProcessTable, Snapshot

log = logging.getLogger(__name__)

KILL_GRACE_S = 5.0
POLLS_S = (0.005, 0.01, 0.02, 0.05)
"""Waits between looks at the members: short first (most are exiting already), then 50 ms."""


class Stopper:
    def __init__(self, grace_s: float = KILL_GRACE_S) -> None:
        self.grace_s = grace_s
        self._processes = ProcessTable()

    async def stop(
        self,
        cage: Cage,
        tracking: str,
        roots: Collection[int],
        leader: int | None,
        *,
        while_waiting: Callable[[], None] = lambda: None,
        what: str = "the environment",
    ) -> None:
        """Stop every member of the job. `leader` is the wrapper's process group (signalled
        as a group); `while_waiting` runs between polls (the backend reaps its children)."""
        fresh = 1.0  # one snapshot of /proc serves every deletion of a sweep
        pids = await self._members(cage, tracking, roots, fresh)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not pids:
                break
            if sig is signal.SIGKILL:
                cage.kill()
            if leader is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(leader, sig)
            for one in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(one, sig)
            deadline = time.monotonic() + self.grace_s
            polls = 0
            while pids and time.monotonic() < deadline:
                while_waiting()
                await asyncio.sleep(POLLS_S[min(polls, len(POLLS_S) - 1)])
                polls += 1
                pids = await self._members(cage, tracking, roots, 0.0)
        if pids:
            log.error("processes of %s survived SIGKILL: %s", what, sorted(pids))
        await asyncio.to_thread(cage.release)

    async def _members(self, cage: Cage, tracking: str, roots: Collection[int], max_age_s: float) -> set[int]:
        held = cage.members()  # the wrapper joined it first: everything of the job is in it
        if held is not None:
            return held
        return (await self._snapshot(max_age_s)).belonging(tracking, roots)

    async def _snapshot(self, max_age_s: float) -> Snapshot:
        """The process table, read again (in a thread: all of /proc) only when older than `max_age_s`."""
        cached = self._processes.cached(max_age_s)
        return cached if cached is not None else await asyncio.to_thread(self._processes.snapshot, max_age_s)
