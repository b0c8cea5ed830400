"""The pool's sandboxes, listed every `pollIntervalSeconds` (OpenSandbox has no watch API):
what changed wakes the reaper, and every lease is renewed while its job runs.

Each list is one request per 200 sandboxes. A sandbox whose phase changed since the last list
(a new one, one that started, ended or vanished; one whose deadline or start timeout passed)
wakes the reaper for its assignment. A sandbox that has not ended and whose expiry is less
than half a lease away is renewed to one lease from now — never past its job's deadline plus
the grace — so a controller that dies lets its VMs expire on their own within a lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from dynrunner.controller import contract
from dynrunner.controller.backends.base import Phase, Wake
from dynrunner.controller.backends.opensandbox import builders, selection
from dynrunner.controller.backends.opensandbox.api import OpenSandboxApi, OpenSandboxError
from dynrunner.controller.backends.opensandbox.builders import VmSettings
from dynrunner.controller.backends.opensandbox.diagnosis import DEADLINE_SLACK, SandboxView, classify

log = logging.getLogger(__name__)

RENEW_CONCURRENCY = 8
FRESH_POLLS = 3
FRESH_SLACK_S = 1.0
RENEW_MIN_GAIN = timedelta(seconds=5)
Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


class PoolWatch:
    def __init__(
        self,
        api: OpenSandboxApi,
        settings: VmSettings,
        clock: Clock = utcnow,
        deadline_grace: timedelta = DEADLINE_SLACK,
    ) -> None:
        self._api = api
        self._settings = settings
        self._clock = clock
        self.deadline_grace = deadline_grace
        self.seen: dict[str, SandboxView] = {}
        """Assignment id → the job's sandbox as last listed or read."""
        self.gone: dict[str, SandboxView] = {}
        """Assignment id → the last view of a job's sandbox that no longer exists."""
        self._phases: dict[str, Phase] = {}
        self._malformed: set[str] = set()
        self.finished: set[str] = set()
        """Assignments whose sandbox this controller deleted (their task is finalized, or their
        launch failed): never renewed, should a delete have failed or a list lag behind."""
        self.listed: dict[str, list[SandboxView]] = {}
        """Assignment id → every sandbox of the job in the last list (duplicates included)."""
        self._listed_at: float | None = None
        self.synced = asyncio.Event()
        self.renewals = 0
        self.lists = 0
        """Lists made by `sync` (for benchmarks)."""

    @property
    def fresh(self) -> bool:
        """Whether the last list is recent enough to answer from (the watch runs): a few poll
        intervals, so a slow list or a missed one still counts, a stopped watch not."""
        if self._listed_at is None:
            return False
        within = FRESH_POLLS * self._settings.backend.poll_interval_s + FRESH_SLACK_S
        return time.monotonic() - self._listed_at <= within

    @property
    def start_timeout(self) -> timedelta:
        return timedelta(seconds=self._settings.backend.start_timeout_s)

    def note(self, assignment_id: str, view: SandboxView | None) -> None:
        """What a read found (None: it does not exist), between two lists, and the phase the
        caller was told: the watch wakes the reaper only for changes nobody has been told of
        (a wake for a change already seen would send the reaper to look at a phase that has
        changed again since, or not at all)."""
        if view is not None:
            self.seen[assignment_id] = view
            self.gone.pop(assignment_id, None)
        elif assignment_id in self.seen:
            self.gone[assignment_id] = self.seen.pop(assignment_id)
        if view is not None or assignment_id in self._phases:
            self._phases[assignment_id] = self.phase(view, self.gone.get(assignment_id))

    def forget(self, assignment_id: str) -> None:
        self.listed.pop(assignment_id, None)
        self.seen.pop(assignment_id, None)
        self.gone.pop(assignment_id, None)
        self._phases.pop(assignment_id, None)

    def phase(self, view: SandboxView | None, last_seen: SandboxView | None = None) -> Phase:
        deadline = builders.deadline_of((view or last_seen or SandboxView("", "")).metadata)
        return classify(
            view,
            deadline=deadline,
            now=self._clock(),
            start_timeout=self.start_timeout,
            last_seen=last_seen,
            deadline_grace=self.deadline_grace,
        ).phase

    async def run(self, wake: Wake) -> None:
        interval = self._settings.backend.poll_interval_s
        while True:
            try:
                await self.sync(wake)
            except OpenSandboxError as err:
                log.warning("pool %s: the sandboxes cannot be listed: %s", self._settings.pool, err)
            await asyncio.sleep(interval)

    async def sync(self, wake: Wake) -> None:
        """One list: update what is seen, wake for what changed, renew what is due."""
        self.lists += 1
        began = time.monotonic()
        listed = await self._api.list({builders.metadata_key(contract.LABEL_POOL): self._settings.pool})
        groups = selection.by_assignment(listed, self._settings.pool)
        self._diagnose(listed)
        self.listed = groups
        self._listed_at = began
        current = {aid: selection.keeper(views)[0] for aid, views in groups.items()}
        for aid in [a for a in self.seen if a not in current]:
            self.gone[aid] = self.seen.pop(aid)
        self.seen.update(current)
        for aid in set(self._phases) | set(current):
            view = current.get(aid)
            phase = self.phase(view, self.gone.get(aid))
            if self._phases.get(aid) != phase:
                self._phases[aid] = phase
                wake(aid)
            if view is None and phase is Phase.GONE:
                self._phases.pop(aid, None)
        self.finished &= set(groups)
        self.synced.set()
        await self.renew_due([view for aid, view in current.items() if aid not in self.finished])

    def _diagnose(self, listed: list[SandboxView]) -> None:
        """Say once which of the pool's sandboxes are skipped for metadata no job of ours has."""
        bad = {}
        for view in listed:
            if view.metadata.get(builders.metadata_key(contract.LABEL_POOL)) == self._settings.pool:
                why = builders.malformed(view.metadata)
                if why:
                    bad[view.id] = why
        for sandbox_id in bad.keys() - self._malformed:
            log.warning(
                "pool %s: sandbox %s is skipped: its metadata is no job's (%s)",
                self._settings.pool,
                sandbox_id,
                bad[sandbox_id],
            )
        self._malformed = set(bad)

    def _alive(self, view: SandboxView, now: datetime) -> bool:
        """Whether a sandbox still has a job to run: not ended, and staged, or still within the
        start timeout (one that never took its job is the reaper's to remove)."""
        if view.ended:
            return False
        if builders.stage_of(view.metadata) != builders.STAGE_CREATED:
            return True
        return view.created_at is None or now - view.created_at < self.start_timeout

    async def renew_due(self, views: list[SandboxView]) -> None:
        now = self._clock()
        backend = self._settings.backend
        due = []
        for view in views:
            if not self._alive(view, now) or not builders.renewal_due(view.expires_at, backend, now):
                continue
            target = builders.expires_at(builders.deadline_of(view.metadata), backend, now)
            if view.expires_at is not None and target - view.expires_at >= RENEW_MIN_GAIN:
                due.append((view, target))
        slots = asyncio.Semaphore(RENEW_CONCURRENCY)

        async def renew(view: SandboxView, target: datetime) -> None:
            async with slots:
                try:
                    await self._api.renew(view.id, target)
                    self.renewals += 1
                except OpenSandboxError as err:
                    log.warning("sandbox %s could not be renewed (tried again next time): %s", view.id, err)

        await asyncio.gather(*(renew(v, t) for v, t in due))
