"""A pool's permits shared by controller replicas (a real nats-server): never more than the
limit taken across replicas, a permit released by any replica frees a waiter anywhere,
reservations of a replica process that is gone are collected, an assignment whose claimer
died gets an extra permit, and permits of assignments that are over are collected."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from nats.js.kv import KeyValue

from dynrunner.controller.config.model import NatsConfig
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.coordination.permits import Permit, PermitLedger, open_permits_bucket
from dynrunner.controller.infra.loops import Stopped, Stopping
from tests.fixtures.controller_samples import LogFactory
from tests.fixtures.harness import wait_for
from tests.fixtures.nats import NatsServer

LIMIT = 5


@pytest.fixture
async def kv(nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory) -> KeyValue:
    log = await open_log(nats_server_module.url, nats_config)
    return await open_permits_bucket(log.js, nats_config.permits_bucket)


class Replicas:
    """Replica processes by name → incarnation, as their leases would say."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.live: dict[str, str] = {}
        self.over: set[str] = set()
        self._running: list[asyncio.Task[None]] = []
        self._ledgers: list[PermitLedger] = []

    async def incarnation_of(self, name: str) -> str | None:
        return self.live.get(name)

    async def finished(self, ids: set[str]) -> set[str]:
        return ids & self.over

    async def ledger(self, name: str, incarnation: str = "1", **kwargs: float) -> PermitLedger:
        self.live[name] = incarnation
        ledger = PermitLedger(
            self.kv,
            "pool",
            LIMIT,
            replica=name,
            incarnation=incarnation,
            incarnation_of=self.incarnation_of,
            over=self.finished,
            adopt_grace_s=kwargs.get("grace", 0.2),
            collect_interval_s=kwargs.get("collect", 3600),
        )
        self._ledgers.append(ledger)
        self._running.append(asyncio.create_task(ledger.run()))
        return ledger

    async def close(self) -> None:
        """Stop as the controller does: the flag first, as a cancellation alone can be lost
        in 3.11's `wait_for` (this teardown once hung for the whole test timeout)."""
        for ledger in self._ledgers:
            ledger.stop()
        for task in self._running:
            task.cancel()
        for task in self._running:
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.fixture
async def replicas(kv: KeyValue) -> AsyncIterator[Replicas]:
    found = Replicas(kv)
    try:
        yield found
    finally:
        await found.close()


async def settle(*ledgers: PermitLedger) -> None:
    """Every queued write made and seen by every mirror."""
    for ledger in ledgers:
        await ledger.flush()
    await asyncio.sleep(0.1)


async def test_no_more_than_the_limit_across_replicas_and_any_replica_frees_one(replicas: Replicas) -> None:
    a, b, c = [Capacity("pool", LIMIT, await replicas.ledger(n)) for n in "abc"]
    waiting = [asyncio.create_task(cap.reserve()) for cap in (a, b, c) for _ in range(3)]
    await asyncio.sleep(0.5)
    granted = [t for t in waiting if t.done()]
    assert len(granted) == LIMIT  # 9 asked, across three replicas
    pending = [t for t in waiting if not t.done()]
    # The first reservation of a (or b...) is bound to an assignment, which replica c reaps.
    first = granted[0].result()
    owner = next(cap for cap in (a, b, c) if first._capacity is cap)
    first.bind("assignment-1")
    await settle(*(cap.ledger for cap in (a, b, c)))  # type: ignore[misc]
    assert [p.assignment for p in c.ledger.of("assignment-1")] == ["assignment-1"]  # type: ignore[union-attr]
    assert owner.pool_in_use == 1
    c.release("assignment-1")
    await wait_for(lambda: sum(t.done() for t in pending) == 1, within=5)
    # A cancelled reservation frees one too.
    granted[1].result().cancel()
    await wait_for(lambda: sum(t.done() for t in pending) == 2, within=5)
    assert sum(t.done() for t in waiting) == LIMIT + 2
    for t in waiting:
        if not t.done():
            t.cancel()
        elif not t.result().done:
            t.result().cancel()


async def test_a_wait_for_a_free_permit_ends_on_the_claim_loops_stop_flag(replicas: Replicas) -> None:
    """A claim loop stopping while every permit is taken: the flag alone ends its wait, which
    a cancellation lost on Python 3.11 would otherwise leave waiting for a job to end."""
    capacity = Capacity("pool", LIMIT, await replicas.ledger("a"))
    taken = [await capacity.reserve() for _ in range(LIMIT)]
    stopping = Stopping()
    waiting = asyncio.create_task(capacity.reserve(stopping))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    stopping.set()
    with pytest.raises(Stopped):
        await asyncio.wait_for(waiting, 5)
    assert capacity.ledger is not None and capacity.ledger.taken == LIMIT  # the stopped wait took none
    for reservation in taken:
        reservation.cancel()


async def test_reservations_of_a_replica_process_that_is_gone_are_collected(replicas: Replicas) -> None:
    a = await replicas.ledger("a", "first")
    b = await replicas.ledger("b")
    for _ in range(3):
        await a.acquire()
    kept = await b.acquire()
    await settle(a, b)
    assert b.taken == 4
    replicas.live["a"] = "second"  # a was killed and restarted under its name
    assert len(await b.collect()) == 3
    await settle(b)
    assert [p.key for p in b.entries()] == [kept.key]


async def test_an_assignment_whose_claimer_died_gets_an_extra_permit_once(replicas: Replicas) -> None:
    a = await replicas.ledger("a")
    b = await replicas.ledger("b")
    permits = [await a.acquire() for _ in range(LIMIT)]
    a.bind(permits[0], "claimed")  # bound in time: no extra permit for it
    b.adopt("claimed")
    b.adopt("orphan")  # its claimer died between publish and bind
    await asyncio.sleep(0.5)
    await settle(a, b)
    assert [p.key for p in b.of("orphan")] == ["pool.x.orphan"]
    assert len(b.of("claimed")) == 1
    assert b.taken == LIMIT + 1  # over the limit: claimed work always runs
    b.release("orphan")
    await settle(a, b)
    assert b.taken == LIMIT


async def test_an_assignment_bound_and_released_within_the_grace_gets_no_extra_permit(replicas: Replicas) -> None:
    """A short job: claimed and bound by replica a, launched by b, reaped and released by a,
    all before b's grace for its delivery ended. Its claimer was alive and bound it in time;
    before, b saw no permit at the end of the grace and made an extra one for a job that was
    over, which held a slot of the pool until a collection removed it."""
    a = await replicas.ledger("a")
    b = await replicas.ledger("b", grace=20.0)
    permit = await a.acquire()
    b.adopt("short")  # b's launcher got the delivery before a's bind reached NATS
    a.bind(permit, "short")
    await wait_for(lambda: b.of("short"), within=20, what="b seeing the bind")
    a.release("short")
    await wait_for(lambda: not b.of("short"), within=20, what="b seeing the release")
    await wait_for(lambda: not b._adopting, within=30, what="b's grace for the delivery over")
    await settle(a, b)
    assert b.entries() == [] and a.entries() == []


async def test_permits_of_assignments_that_are_over_are_collected(replicas: Replicas) -> None:
    a = await replicas.ledger("a")
    b = await replicas.ledger("b")
    permit = await a.acquire()
    a.bind(permit, "done-elsewhere")
    await settle(a, b)
    assert await b.collect() == []
    replicas.over.add("done-elsewhere")  # reaped by a replica killed before it released the permit
    assert await b.collect() == [permit.key]


async def test_a_permit_whose_create_answer_was_lost_is_collected_by_its_own_process(replicas: Replicas) -> None:
    """The create reached NATS but its answer did not come back (a timeout): nobody holds that
    reservation, though its process is alive. Its own collector removes it — on the second look,
    so a create whose answer is merely on its way is never taken for one."""
    a = await replicas.ledger("a")
    held = await a.acquire()
    lost = Permit(next(f"pool.{i}" for i in range(LIMIT) if f"pool.{i}" != held.key), "a", "1", None, 0)
    await replicas.kv.create(lost.key, lost.value())
    await settle(a)
    assert await a.collect() == []
    assert await a.collect() == [lost.key]
    await settle(a)
    assert [p.key for p in a.entries()] == [held.key]
