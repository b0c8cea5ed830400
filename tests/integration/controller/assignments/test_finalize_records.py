"""The finalize records' suite: the sealed KV bucket on a real nats-server, and the in-memory
store the launcher and reaper tests use, keep and refuse alike."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats
import pytest
from nats.js import JetStreamContext

from dynrunner.controller.assignments.finalize_records import (
    RECORD_TTL,
    FinalizeRecord,
    FinalizeRecords,
    FinalizeRecordStore,
)
from dynrunner.controller.config.model import NatsConfig
from dynrunner.controller.infra.sealing import Sealer, SealingError
from dynrunner.proto.assignment import CacheServiceOptions
from tests.fixtures.controller_samples import RUNNER_TOKEN, TASK_SECRET, make_assignment
from tests.fixtures.nats import MemoryFinalizeRecords, NatsServer

SEALER = Sealer(b"f" * 32)


@dataclass
class Store:
    records: FinalizeRecords
    raw: dict[str, bytes] | None  # what is stored, by key (memory) …
    js: JetStreamContext | None  # … or the bucket to read it from
    bucket: str = ""

    async def stored(self, key: str) -> bytes:
        if self.raw is not None:
            return self.raw[key]
        assert self.js is not None
        entry = await (await self.js.key_value(self.bucket)).get(key)
        assert entry.value is not None
        return entry.value

    async def store(self, key: str, value: bytes) -> None:
        if self.raw is not None:
            self.raw[key] = value
            return
        assert self.js is not None
        await (await self.js.key_value(self.bucket)).put(key, value)


@pytest.fixture(params=["kv", "memory"])
async def store(request: pytest.FixtureRequest, nats_config: NatsConfig) -> AsyncIterator[Store]:
    if request.param == "memory":
        memory = MemoryFinalizeRecords(SEALER)
        yield Store(memory, memory.stored, None)
        return
    server: NatsServer = request.getfixturevalue("nats_server_module")
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        records = await FinalizeRecordStore.open(js, SEALER, nats_config.finalize_bucket)
        yield Store(records, None, js, nats_config.finalize_bucket)
    finally:
        await nc.close()


async def test_a_record_is_kept_until_deleted(store: Store) -> None:
    a = make_assignment("pod", task_id=12)
    record = FinalizeRecord.of(a)
    assert await store.records.get(a.assignment_id) is None
    await store.records.put(record)
    await store.records.put(record)  # again (a redelivered launch): harmless
    assert await store.records.get(a.assignment_id) == record
    assert (record.task_id, record.runner, record.pool) == (12, a.runner, "pod")
    assert TASK_SECRET in record.masks and RUNNER_TOKEN in record.masks
    await store.records.delete(a.assignment_id)
    assert await store.records.get(a.assignment_id) is None
    await store.records.delete(a.assignment_id)  # what is not there: success


async def test_a_deleted_record_is_consumed_and_what_stays_holds_no_credential(store: Store) -> None:
    """Another replica that sees the environment gone asks whether the record was consumed
    (the environment was reaped) before it would finalize the task as vanished."""
    a = make_assignment("pod", task_id=13)
    await store.records.put(FinalizeRecord.of(a))
    assert not await store.records.consumed(a.assignment_id)
    await store.records.delete(a.assignment_id)
    assert await store.records.consumed(a.assignment_id)
    if store.raw is None:  # the KV bucket keeps a mark, one revision per key: nothing of the record
        kept = await store.stored(a.assignment_id)
        assert RUNNER_TOKEN.encode() not in kept and TASK_SECRET.encode() not in kept
        assert kept == b'{"consumed":true}'


async def test_what_is_stored_is_sealed(store: Store) -> None:
    a = make_assignment()
    await store.records.put(FinalizeRecord.of(a))
    stored = await store.stored(a.assignment_id)
    for secret in (RUNNER_TOKEN, TASK_SECRET, a.runner.uuid, "task-token-Vv1"):
        assert secret.encode() not in stored


async def test_a_record_moved_under_another_assignment_or_altered_does_not_open(store: Store) -> None:
    a, b = make_assignment(), make_assignment()
    await store.records.put(FinalizeRecord.of(a))
    await store.records.put(FinalizeRecord.of(b))
    await store.store(b.assignment_id, await store.stored(a.assignment_id))
    with pytest.raises(SealingError):
        await store.records.get(b.assignment_id)
    altered = bytearray(await store.stored(a.assignment_id))
    altered[-20] ^= 1
    await store.store(a.assignment_id, bytes(altered))
    with pytest.raises(SealingError):
        await store.records.get(a.assignment_id)
    await store.store(a.assignment_id, b"not a record")
    with pytest.raises(SealingError):
        await store.records.get(a.assignment_id)


async def test_the_bucket_collects_what_a_crash_left_behind(
    nats_server_module: NatsServer, nats_config: NatsConfig
) -> None:
    nc = await nats.connect(nats_server_module.url)
    try:
        await FinalizeRecordStore.open(nc.jetstream(), SEALER, nats_config.finalize_bucket)
        status = await (await nc.jetstream().key_value(nats_config.finalize_bucket)).status()
        assert status.history == 1
        assert status.ttl == pytest.approx(RECORD_TTL.total_seconds())
    finally:
        await nc.close()


def test_a_jobs_cache_token_is_kept_only_with_a_cache_and_older_records_still_read() -> None:
    """The record keeps the runtime token a job registered with the actions cache (the reaper
    revokes it when it finalizes the job), and only when the job was given a cache; a record
    written before the field existed reads as one without."""
    a = make_assignment("pod", task_id=3)
    assert FinalizeRecord.of(a).cache_token == ""
    task = dataclasses.replace(a.task, context={**a.task.context, "gitea_runtime_token": "rt-3"})
    cached = a.replace(task=task, executor=dataclasses.replace(a.executor, cache=CacheServiceOptions(grant="g")))
    record = FinalizeRecord.of(cached)
    assert record.cache_token == "rt-3" and "rt-3" not in repr(record)
    assert FinalizeRecord.from_json(record.to_json()) == record
    older = json.loads(record.to_json())
    del older["cache_token"]
    assert FinalizeRecord.from_json(json.dumps(older).encode()).cache_token == ""
