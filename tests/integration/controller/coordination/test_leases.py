"""Leases in a JetStream KV bucket whose entries expire (a real nats-server): a replica holds
the lease on its name, a process restarted under that name takes it over and the earlier one
stops, an exclusive lease has one holder at a time, and a holder fences itself before its
lease can expire. The bucket's TTL is 1 s here: expiry is the server's to measure, so these
tests wait for it (about a second each)."""

from __future__ import annotations

import asyncio
import time

import nats.js.errors
import pytest
from nats.js.kv import KeyValue

from dynrunner.controller.config.model import NatsConfig
from dynrunner.controller.coordination.leases import (
    Lease,
    ReplicaNameTaken,
    exclusive,
    open_lease_bucket,
    replica_alive,
    replica_key,
)
from tests.fixtures.controller_samples import LogFactory
from tests.fixtures.kv_memory import MemoryKeyValue
from tests.fixtures.nats import NatsServer

TTL = 1.0


@pytest.fixture
async def kv(nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory) -> KeyValue:
    log = await open_log(nats_server_module.url, nats_config)
    return await open_lease_bucket(log.js, nats_config.replicas_bucket, ttl_s=TTL)


def replica(kv: KeyValue, name: str) -> Lease:
    return Lease(kv, replica_key(name), name, exclusive=False, ttl_s=TTL)


async def until(predicate, within: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_replica_lease_is_seen_while_renewed_and_expires_when_not(kv: KeyValue) -> None:
    lease = replica(kv, "controller-a")
    assert not await replica_alive(kv, "controller-a")
    assert await lease.renew() and lease.held and lease.term == 1
    assert await replica_alive(kv, "controller-a")
    for _ in range(4):  # renewed for twice the TTL: still there
        await asyncio.sleep(TTL / 2)
        assert await lease.renew()
    assert await replica_alive(kv, "controller-a")
    await until(lambda: _not(replica_alive(kv, "controller-a")))  # not renewed: gone
    # Its holder, back after the expiry, takes it again under a new term.
    assert await lease.renew() and lease.term == 2
    assert await replica_alive(kv, "controller-a")


async def _not(alive) -> bool:  # type: ignore[no-untyped-def]
    return not await alive


async def test_a_process_restarted_under_the_same_name_takes_over_and_the_earlier_one_stops(kv: KeyValue) -> None:
    earlier, restarted = replica(kv, "controller-b"), replica(kv, "controller-b")
    assert await earlier.renew()
    assert await restarted.renew()  # at once, without waiting for the earlier lease to expire
    with pytest.raises(ReplicaNameTaken, match="DYNRUNNER_REPLICA"):
        await earlier.renew()
    assert not earlier.held
    assert await restarted.renew() and restarted.held


async def test_a_renewal_whose_answer_was_lost_is_recognised(kv: KeyValue) -> None:
    lease = replica(kv, "controller-c")
    assert await lease.renew()
    await kv.put(replica_key("controller-c"), lease._value)  # written by us, answer never seen
    assert await lease.renew() and lease.term == 1


async def test_an_exclusive_lease_has_one_holder_and_passes_on(kv: KeyValue) -> None:
    first = Lease(kv, "reaper.pool", "a", exclusive=True, ttl_s=TTL)
    second = Lease(kv, "reaper.pool", "b", exclusive=True, ttl_s=TTL)
    assert await first.renew()
    assert not await second.renew() and not second.held
    await first.release()  # a graceful stop: no waiting for the expiry
    assert await second.renew() and second.held
    third = Lease(kv, "reaper.pool", "c", exclusive=True, ttl_s=TTL)
    assert not await third.renew()
    await until(third.renew)  # `second` stopped renewing: it expires, `third` takes it
    assert not await second.renew() and not second.held  # and `second` learns it lost it


async def test_a_holder_stops_acting_before_its_lease_can_expire() -> None:
    now = [100.0]
    lease = Lease(MemoryKeyValue(), "replicas.x", "x", exclusive=False, ttl_s=10.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert await lease.renew()
    now[0] += 5.9
    assert lease.held
    now[0] += 0.2  # 6.1 s after the renewal was *sent*: the server keeps the key at least 10 s
    assert not lease.held


class ExpiresInsideCreate(MemoryKeyValue):
    """A key whose TTL ends between the two requests of nats-py's `create`: its write finds the
    key in place, its re-read (for a delete's tombstone) finds nothing. Hit once in four runs
    of this module on a loaded machine, by `test_an_exclusive_lease_has_one_holder_and_passes_on`."""

    expired = False

    async def create(self, key: str, value: bytes, validate_keys: bool = True, msg_ttl: float | None = None) -> int:
        if key in self._entries and not self.expired:
            self.expired = True
            del self._entries[key]
            raise nats.js.errors.KeyNotFoundError
        return await super().create(key, value, validate_keys, msg_ttl)


async def test_a_lease_that_expires_while_another_tries_to_take_it_is_taken() -> None:
    kv = ExpiresInsideCreate()
    assert await Lease(kv, "reaping.x", "a", exclusive=True).renew()  # type: ignore[arg-type]
    successor = Lease(kv, "reaping.x", "b", exclusive=True)  # type: ignore[arg-type]
    assert await successor.renew() and successor.held
    assert kv.expired


async def test_work_under_an_exclusive_lease_is_done_by_one_holder_at_a_time(kv: KeyValue) -> None:
    async with exclusive(kv, "reaping.a1", "a") as first:
        async with exclusive(kv, "reaping.a1", "b") as second:
            assert first and not second
        async with exclusive(kv, "reaping.a2", "b") as other:
            assert other  # another key: independent
    async with exclusive(kv, "reaping.a1", "b") as after:
        assert after  # released at the end of the block, not left to expire


async def test_an_exclusive_lease_is_released_when_a_cancel_lands_while_it_lets_go(kv: KeyValue) -> None:
    """A controller's stop both ends a start follower (it leaves its block) and cancels it: the
    cancellation then lands in the lease's own clean-up. The lease is released all the same,
    not left to expire in the way of the next controller's follower."""
    entered = asyncio.Event()

    async def hold() -> None:
        async with exclusive(kv, "following.a1", "a") as held:
            assert held
            entered.set()
            await asyncio.Event().wait()

    holder = asyncio.create_task(hold())
    await entered.wait()
    holder.cancel()  # leaves the block ...
    await asyncio.sleep(0)  # ... and waits for its renewal loop to end
    holder.cancel()  # the second cancellation lands in that wait
    with pytest.raises(asyncio.CancelledError):
        await holder
    async with exclusive(kv, "following.a1", "b") as after:
        assert after  # well within the TTL: released, not expired


async def test_a_lease_stops_renewing_when_told_even_without_a_cancel(kv: KeyValue) -> None:
    """Python 3.11's asyncio.wait_for (under nats-py's requests) can swallow a cancellation that
    arrives with the answer; a renewal loop that only ended on cancel then renewed forever and
    held up whoever awaited it (a reaper stuck in `exclusive`, a controller that would not stop)."""
    lease = Lease(kv, "reaping.stop", "a", exclusive=True, ttl_s=TTL)
    renewing = asyncio.create_task(lease.run())
    await until(lambda: _held(lease))
    lease.stop()
    await asyncio.wait_for(renewing, TTL)


async def _held(lease: Lease) -> bool:
    return lease.held
