"""A claim bound late to its permit (a publish retried after a slow PubAck, a busy permit
writer, a mirror behind): the permits' adopt grace (2 s) ran out while the claimer was alive.
A replica whose own claimer bound the permit — its write only queued — adds no extra one
(before, it did, as if that claimer were gone); another replica cannot tell a late bind
from a dead claimer: it says so, and its extra permit is collected once the regular one
shows."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.js.kv import KeyValue

from dynrunner.controller.config.model import NatsConfig
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.coordination.permits import PermitLedger, open_permits_bucket
from tests.fixtures.controller_samples import LogFactory
from tests.fixtures.harness import wait_for
from tests.fixtures.nats import NatsServer

GRACE_S = 0.2


class HeldUpdates:
    """The permits bucket, whose updates (a bind) wait until `go` is set: a busy writer."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def update(self, *args: Any, **kwargs: Any) -> int:
        await self.go.wait()
        return await self._kv.update(*args, **kwargs)


@pytest.fixture
async def kv(nats_server: NatsServer, nats_config: NatsConfig, open_log: LogFactory) -> KeyValue:
    log = await open_log(nats_server.url, nats_config)
    return await open_permits_bucket(log.js, nats_config.permits_bucket)


class Ledgers:
    """Running ledgers of replicas on one bucket, stopped at teardown."""

    def __init__(self) -> None:
        self.running: list[tuple[PermitLedger, asyncio.Task[None]]] = []

    def make(self, replica: str, bucket: Any) -> PermitLedger:
        async def alive(name: str) -> str | None:
            return "1"

        ledger = PermitLedger(
            bucket, "pool", 4, replica=replica, incarnation="1", incarnation_of=alive, adopt_grace_s=GRACE_S
        )
        self.running.append((ledger, asyncio.create_task(ledger.run())))
        return ledger

    async def close(self) -> None:
        for ledger, task in self.running:
            ledger.stop()
            task.cancel()
        await asyncio.gather(*(task for _, task in self.running), return_exceptions=True)


@pytest.fixture
async def ledgers() -> AsyncIterator[Ledgers]:
    made = Ledgers()
    yield made
    await made.close()


async def test_a_delivery_before_its_own_claimers_bind_gets_no_extra_permit(
    kv: KeyValue, ledgers: Ledgers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynrunner")
    bucket = HeldUpdates(kv)
    ledger = ledgers.make("a", bucket)
    capacity = Capacity("pool", 4, ledger)
    reservation = await capacity.reserve()
    capacity.adopt("job-1")  # the launcher got the delivery before the claimer's publish returned
    reservation.bind("job-1")  # queued behind a busy writer
    await wait_for(lambda: not ledger._adopting, within=10, what="the adopt grace over")
    bucket.go.set()
    await ledger.flush()
    await wait_for(lambda: ledger.of("job-1"), within=10, what="the bind in the mirror")
    assert [p.key for p in ledger.entries()] == [reservation._permit.key]
    assert "extra one" not in caplog.text


async def test_another_replicas_late_bind_is_told_as_such_and_its_extra_permit_collected(
    kv: KeyValue, ledgers: Ledgers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynrunner")
    claiming = Capacity("pool", 4, ledgers.make("a", kv))
    seeing = Capacity("pool", 4, ledgers.make("b", kv))
    b = seeing.ledger
    assert b is not None
    reservation = await claiming.reserve()
    seeing.adopt("job-1")  # b's launcher (or reaper) before a's bind shows
    await wait_for(lambda: not b._adopting, within=10, what="the adopt grace over")
    reservation.bind("job-1")  # a's claimer, alive, binds late
    await wait_for(lambda: len(b.of("job-1")) == 2, within=10, what="the extra and the regular permit")
    assert "its claimer is gone" not in caplog.text
    assert "its claimer died between the publish and the bind, or its bind is late" in caplog.text
    assert await b.collect() == ["pool.x.job-1"]
