"""The launch record's conformance suite: the KV bucket on a real nats-server, and the
in-memory record the launcher tests use, decide alike."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest

from dynrunner.controller.assignments.launched import RECORD_TTL, Launched, LaunchedRecord, LaunchRecord
from dynrunner.controller.config.model import NatsConfig
from tests.fixtures.nats import MemoryLaunchRecord, NatsServer


@pytest.fixture(params=["kv", "memory"])
async def record(request: pytest.FixtureRequest, nats_config: NatsConfig) -> AsyncIterator[LaunchRecord]:
    if request.param == "memory":
        yield MemoryLaunchRecord()
        return
    server: NatsServer = request.getfixturevalue("nats_server_module")
    nc = await nats.connect(server.url)
    try:
        yield await LaunchedRecord.open(nc.jetstream(), nats_config.launched_bucket)
    finally:
        await nc.close()


async def test_the_first_message_launches_and_its_redeliveries_resume_then_are_answered(record: LaunchRecord) -> None:
    assert await record.begin("a-1", 7) == ("launch", None)
    assert await record.begin("a-1", 7) == ("resume", Launched("launching", 7))
    await record.done("a-1", 7)
    assert await record.begin("a-1", 7) == ("answered", Launched("done", 7))


async def test_any_other_message_of_the_assignment_is_a_replay(record: LaunchRecord) -> None:
    assert (await record.begin("a-2", 7))[0] == "launch"
    assert await record.begin("a-2", 9) == ("replayed", Launched("launching", 7))  # while it launches
    await record.done("a-2", 7)
    assert await record.begin("a-2", 9) == ("replayed", Launched("done", 7))  # after the job ran
    assert await record.begin("a-3", 9) == ("launch", None)  # other assignments are not affected


async def test_the_bucket_keeps_entries_longer_than_any_job_runs(nats_server_module: NatsServer) -> None:
    nc = await nats.connect(nats_server_module.url)
    try:
        js = nc.jetstream()
        opened = await LaunchedRecord.open(js, "T_LAUNCHED_TTL")
        again = await LaunchedRecord.open(js, "T_LAUNCHED_TTL")  # idempotent
        info = await js.stream_info("KV_T_LAUNCHED_TTL")
        assert info.config.max_age == RECORD_TTL.total_seconds()
        assert opened.bucket == again.bucket
    finally:
        await nc.close()


async def test_two_replicas_given_the_same_message_launch_it_once_between_them(
    nats_server_module: NatsServer, nats_config: NatsConfig
) -> None:
    """Two controller replicas (two connections) get deliveries of one stream message at
    once — the first replica stopped answering for ackWait, or both pulled a redelivery: one
    launches, the other resumes the same launch (the backend's create is idempotent); once
    either recorded it done, every further delivery is only acknowledged, and another message
    of that assignment is a replay for both."""
    connections = [await nats.connect(nats_server_module.url) for _ in range(2)]
    try:
        a, b = [await LaunchedRecord.open(nc.jetstream(), nats_config.launched_bucket) for nc in connections]
        for round_ in range(20):
            aid = f"both-{round_}"
            verdicts = sorted(v for v, _ in await asyncio.gather(a.begin(aid, 7), b.begin(aid, 7)))
            assert verdicts == ["launch", "resume"]
            await asyncio.gather(a.done(aid, 7), b.done(aid, 7))
            assert [v for v, _ in await asyncio.gather(a.begin(aid, 7), b.begin(aid, 7))] == ["answered"] * 2
            assert [v for v, _ in await asyncio.gather(a.begin(aid, 8), b.begin(aid, 8))] == ["replayed"] * 2
    finally:
        for nc in connections:
            await nc.close()
