"""A pool's capacity permits shared by every controller replica, as JetStream KV entries.

`maxConcurrency` bounds the pool as a whole, whatever the number of replicas: a claim loop
polls Gitea only while it holds a permit, and a permit is a key `<pool>.<i>` with
`0 ≤ i < maxConcurrency`, taken by *creating* it (a compare-and-set: of two replicas
creating one key, one succeeds). So at most `maxConcurrency` claims are in flight or running
in the pool at any time. The entry says who holds it: a replica's reservation (its name and
process incarnation) while it polls, then the assignment it was bound to until that
assignment is over.

Each replica keeps a mirror of the pool's entries (a KV watch): it picks free keys from it,
waits for a change when none is free, and finds an assignment's permit by its id. Writes
other than taking a permit are queued and made in order by one writer (the callers are not
held up by NATS; each write is idempotent and retried).

An assignment delivered with no permit in the mirror (its claimer died between the publish
and the bind) gets an *extra* permit `<pool>.x.<assignment id>` unless one of its permits
shows within a grace: claimed work always runs, even when that briefly goes over the limit.
Collection (every few seconds, by every replica; conditional deletes, so replicas never undo
each other's work) removes reservations of replica processes that are gone, and extra
permits of assignments that hold a regular one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from dynrunner.controller.assignments.log import open_bucket
from dynrunner.controller.coordination.leases import replica_incarnation, wrong_last_sequence
from dynrunner.controller.infra.loops import Stopping

__all__ = ["ADOPT_GRACE_S", "LedgerFactory", "Permit", "PermitLedger", "ledger_factory", "open_permits_bucket"]

log = logging.getLogger(__name__)

ADOPT_GRACE_S = 2.0
"""How long a delivered assignment without a permit waits for its claimer's bind to show
before it gets an extra permit."""
COLLECT_INTERVAL_S = 5.0
_POLL_S = 1.0
_RETRY_S = 0.5


async def open_permits_bucket(js: JetStreamContext, bucket: str, *, replicas: int = 1) -> KeyValue:
    return await open_bucket(
        js,
        KeyValueConfig(
            bucket=bucket,
            description="dynrunner: each pool's capacity permits, shared by the controller replicas",
            history=1,
            storage=StorageType.FILE,
            replicas=replicas,
        ),
    )


Over = Callable[[set[str]], Awaitable[set[str]]]
LedgerFactory = Callable[[str, int, Over], "PermitLedger"]


def ledger_factory(permits: KeyValue, leases: KeyValue, *, replica: str, incarnation: str) -> LedgerFactory:
    """Makes each pool's ledger for this replica process (`replica`, `incarnation`), which
    tells the live processes of other replicas from the lease bucket."""

    async def incarnation_of(name: str) -> str | None:
        return await replica_incarnation(leases, name)

    def make(pool: str, limit: int, over: Over) -> PermitLedger:
        return PermitLedger(
            permits, pool, limit, replica=replica, incarnation=incarnation, incarnation_of=incarnation_of, over=over
        )

    return make


@dataclass(frozen=True, slots=True)
class Permit:
    """One entry: held by `replica` (process `incarnation`), bound to `assignment` once claimed."""

    key: str
    replica: str
    incarnation: str
    assignment: str | None
    revision: int

    def value(self) -> bytes:
        return json.dumps(
            {"replica": self.replica, "incarnation": self.incarnation, "assignment": self.assignment},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def parse(cls, key: str, data: bytes, revision: int) -> Permit:
        try:
            raw = json.loads(data)
            return cls(key, str(raw["replica"]), str(raw["incarnation"]), raw.get("assignment"), revision)
        except (ValueError, KeyError, TypeError):
            return cls(key, "", "", None, revision)  # unreadable: collected as a reservation of nobody


class PermitLedger:
    """The permits of one pool as this replica sees and changes them."""

    def __init__(
        self,
        kv: KeyValue,
        pool: str,
        limit: int,
        *,
        replica: str,
        incarnation: str,
        incarnation_of: Callable[[str], Awaitable[str | None]],
        over: Over | None = None,
        adopt_grace_s: float = ADOPT_GRACE_S,
        collect_interval_s: float = COLLECT_INTERVAL_S,
    ) -> None:
        """`incarnation_of(replica)`: the live process of that replica (None: gone).
        `over(assignment ids)`: those whose job is over (no environment, launch done)."""
        self._kv = kv
        self.pool = pool
        self.limit = limit
        self.replica = replica
        self.incarnation = incarnation
        self._incarnation_of = incarnation_of
        self._over = over
        self._adopt_grace_s = adopt_grace_s
        self._collect_interval_s = collect_interval_s
        self._adopting: set[asyncio.Task[None]] = set()
        self._awaited: dict[str, asyncio.Event] = {}
        """Assignments in their adoption grace: set once a permit of theirs shows."""
        self._mine: set[str] = set()
        self._stopping = Stopping()
        self._unclaimed: set[str] = set()
        """Reservations this process took and has not bound or cancelled yet: one of its own
        not in here was taken by a create whose answer was lost, and is collected."""
        self._entries: dict[str, Permit] = {}
        self.bound_seen = 0
        """Permits the mirror saw bound to an assignment so far: the pool's claims, every
        replica's (a claim loop tells from it that it may have lost a race to another replica)."""
        self._synced = asyncio.Event()
        self._changed = asyncio.Event()
        self._writes: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()

    # -- views ---------------------------------------------------------------------------

    @property
    def taken(self) -> int:
        """Entries of the pool (regular and extra permits), as last seen."""
        return len(self._entries)

    def of(self, assignment_id: str) -> list[Permit]:
        return [p for p in self._entries.values() if p.assignment == assignment_id]

    def entries(self) -> list[Permit]:
        return list(self._entries.values())

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self) -> None:
        """Mirror, write and collect until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._mirror(), name=f"permits-mirror-{self.pool}")
            tg.create_task(self._writer(), name=f"permits-writer-{self.pool}")
            tg.create_task(self._collector(), name=f"permits-collect-{self.pool}")

    def stop(self) -> None:
        """End `run()` within a second, even if a cancellation is lost (see `Lease.run`)."""
        self._stopping.set()

    @property
    def stopping(self) -> Stopping:
        """Set by `stop()` (`supervise` restarts nothing once it is)."""
        return self._stopping

    async def _mirror(self) -> None:
        while not self._stopping.is_set():
            watcher = await self._kv.watch(f"{self.pool}.>")
            try:
                while not self._stopping.is_set():
                    try:
                        entry = await watcher.updates(timeout=_POLL_S)
                    except nats.errors.TimeoutError:
                        continue
                    if entry is None:
                        self._synced.set()
                    elif entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
                        self._entries.pop(entry.key, None)
                    else:
                        permit = Permit.parse(entry.key, entry.value, int(entry.revision or 0))
                        previous = self._entries.get(entry.key)
                        if permit.assignment is not None and (
                            previous is None or previous.assignment != permit.assignment
                        ):
                            self.bound_seen += 1
                        self._entries[entry.key] = permit
                        if permit.assignment is not None and permit.assignment in self._awaited:
                            self._awaited[permit.assignment].set()
                    self._changed.set()
            finally:
                with contextlib.suppress(Exception):
                    await watcher.stop()

    async def _writer(self) -> None:
        while not self._stopping.is_set():
            try:
                write = await asyncio.wait_for(self._writes.get(), _POLL_S)
            except TimeoutError:
                continue
            while True:
                try:
                    await write()
                    self._writes.task_done()
                    break
                except Exception as err:
                    log.warning("pool %s: a permit could not be written yet: %s", self.pool, err or type(err).__name__)
                    if await self._stopping.sleep(_RETRY_S):
                        return

    async def _collector(self) -> None:
        """At once (a restarted replica frees what its previous process reserved), then every
        `collect_interval_s`."""
        await self._synced.wait()
        while not self._stopping.is_set():
            try:
                await self.collect()
            except Exception as err:
                log.warning("pool %s: permit collection failed: %s", self.pool, err or type(err).__name__)
            await self._stopping.sleep(self._collect_interval_s)

    async def flush(self, within_s: float = 5.0) -> None:
        """Wait (a bounded time) until the queued writes are made: a graceful stop leaves no
        release behind."""
        try:
            await asyncio.wait_for(self._writes.join(), within_s)
        except TimeoutError:
            log.warning("pool %s: %d permit changes not written at stop", self.pool, self._writes.qsize())

    # -- taking --------------------------------------------------------------------------

    async def acquire(self, until: Stopping | None = None) -> Permit:
        """Wait for a free permit and take it (reserved by this replica, bound to nothing).
        Raises `Stopped` once `until` (the claim loop's stop flag) is set."""
        flag = Stopping() if until is None else until
        while not self._synced.is_set():
            await flag.wait_on(self._synced, COLLECT_INTERVAL_S)
        while True:
            self._changed.clear()
            if len(self._entries) < self.limit:
                free = [i for i in range(self.limit) if f"{self.pool}.{i}" not in self._entries]
                random.shuffle(free)
                for i in free[:3]:
                    permit = Permit(f"{self.pool}.{i}", self.replica, self.incarnation, None, 0)
                    try:
                        revision = await self._kv.create(permit.key, permit.value())
                    except nats.js.errors.KeyWrongLastSequenceError:
                        continue  # another replica took it first
                    taken = Permit(permit.key, self.replica, self.incarnation, None, revision)
                    self._entries.setdefault(taken.key, taken)
                    self._mine.add(taken.key)
                    return taken
            await flag.wait_on(self._changed, COLLECT_INTERVAL_S)

    # -- queued changes ------------------------------------------------------------------

    def bind(self, permit: Permit, assignment_id: str) -> None:
        async def write() -> None:
            current = await self._read(permit.key)
            if current is None or current.incarnation != self.incarnation or current.assignment is not None:
                # Collected meanwhile (NATS saw this process gone): the delivery adopts it.
                log.warning("pool %s: permit %s was collected before it was bound", self.pool, permit.key)
                self._mine.discard(permit.key)
                return
            bound = Permit(permit.key, self.replica, self.incarnation, assignment_id, 0)
            await self._kv.update(permit.key, bound.value(), last=current.revision)
            self._mine.discard(permit.key)

        self._writes.put_nowait(write)

    def cancel(self, permit: Permit) -> None:
        async def write() -> None:
            await self._delete(permit.key, only_assignment=None, only_incarnation=self.incarnation)
            self._mine.discard(permit.key)

        self._writes.put_nowait(write)

    def release(self, assignment_id: str, *, bound_here: Permit | None = None) -> None:
        """The assignment is over: its permits go (whoever took them). `bound_here`: the
        permit this replica bound to it, which the mirror may not show yet."""

        async def write() -> None:
            keys = {p.key for p in self.of(assignment_id)}
            if bound_here is not None:
                keys.add(bound_here.key)
            for key in keys:
                await self._delete(key, only_assignment=assignment_id)

        self._writes.put_nowait(write)

    def adopt(self, assignment_id: str, still: Callable[[], bool] = lambda: True) -> None:
        """A delivered assignment: it gets an extra permit unless one shows within the grace
        (or by then it is over, or bound here with its write still queued: `still()` false). A
        permit that showed counts even when it is gone again by the end of the grace: a short
        job's claimer bound it, and the replica that reaped the job released it. A claimer of
        another replica may bind late (a publish retried, a busy writer): its regular permit
        then shows after the extra one, which the collection removes."""
        if self.of(assignment_id) or assignment_id in self._awaited:
            return
        shown = self._awaited[assignment_id] = asyncio.Event()

        async def write() -> None:
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(shown.wait(), self._adopt_grace_s)
            finally:
                self._awaited.pop(assignment_id, None)
            if shown.is_set() or self.of(assignment_id) or not still():
                return
            extra = Permit(f"{self.pool}.x.{assignment_id}", self.replica, self.incarnation, assignment_id, 0)
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                await self._kv.create(extra.key, extra.value())
            log.info(
                "pool %s: no permit of assignment %s showed within %.0f s (its claimer died between the publish "
                "and the bind, or its bind is late); it got an extra one",
                self.pool,
                assignment_id,
                self._adopt_grace_s,
            )

        task = asyncio.get_running_loop().create_task(self._late(write), name=f"adopt-permit-{assignment_id}")
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    async def _late(self, write: Callable[[], Awaitable[None]]) -> None:
        try:
            await write()
        except Exception as err:
            log.warning("pool %s: an extra permit could not be written: %s", self.pool, err or type(err).__name__)

    async def _read(self, key: str) -> Permit | None:
        try:
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return None if not entry.value else Permit.parse(key, entry.value, int(entry.revision or 0))

    async def _delete(self, key: str, *, only_assignment: str | None, only_incarnation: str | None = None) -> None:
        current = await self._read(key)
        if current is None or current.assignment != only_assignment:
            return
        if only_incarnation is not None and current.incarnation != only_incarnation:
            return  # collected, and taken since by another process: not ours to cancel
        try:
            await self._kv.delete(key, last=current.revision)
        except Exception as err:
            if not wrong_last_sequence(err):
                raise
            return  # changed meanwhile: someone else released or rebound it

    # -- collection ----------------------------------------------------------------------

    async def collect(self) -> list[str]:
        """Remove reservations of replica processes that are gone, extra permits of
        assignments that hold a regular one, and permits of assignments that are over (their
        release was lost with a replica killed). Returns the keys removed."""
        removed: list[str] = []
        alive: dict[str, str | None] = {}
        unclaimed: set[str] = set()
        regular = {p.assignment for p in self._entries.values() if p.assignment and ".x." not in p.key}
        bound = {p.assignment for p in self._entries.values() if p.assignment}
        over = await self._over(bound) if self._over is not None and bound else set()
        for permit in list(self._entries.values()):
            stale = permit.assignment in over
            if permit.assignment is None and permit.incarnation == self.incarnation:
                # Its create's answer was lost (seen twice, so not a create whose answer is on its way).
                stale = permit.key not in self._mine and permit.key in self._unclaimed
                if permit.key not in self._mine:
                    unclaimed.add(permit.key)
            elif permit.assignment is None:
                if permit.replica not in alive:
                    alive[permit.replica] = await self._incarnation_of(permit.replica) if permit.replica else None
                stale = alive[permit.replica] != permit.incarnation
            elif ".x." in permit.key:
                stale = stale or permit.assignment in regular
            if not stale:
                continue
            try:
                await self._kv.delete(permit.key, last=permit.revision)
            except Exception as err:
                if not wrong_last_sequence(err):
                    raise
                continue
            removed.append(permit.key)
        self._unclaimed = unclaimed - set(removed)
        if removed:
            log.info("pool %s: collected permits %s", self.pool, ", ".join(removed))
        return removed
