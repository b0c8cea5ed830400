"""Armed registrations in a JetStream KV bucket: sealed at rest, bound to their pool, and
still there after a NATS restart."""

from __future__ import annotations

import nats.js.errors
import pytest
from nats.js.kv import KeyValue

from dynrunner.controller.assignments.log import bucket_keys
from dynrunner.controller.claiming.registrations_store import RegistrationStore
from dynrunner.controller.config.model import NatsConfig
from dynrunner.controller.infra.sealing import Sealer, SealingError
from tests.fixtures.controller_samples import ARMED_TOKEN as TOKEN
from tests.fixtures.controller_samples import LogFactory, registration
from tests.fixtures.nats import NatsServer


async def raw_value(store: RegistrationStore, js: object, pool: str) -> bytes:
    msg = await js.get_last_msg(f"KV_{store.bucket}", f"$KV.{store.bucket}.{pool}")  # type: ignore[attr-defined]
    return msg.data


async def test_round_trip_and_no_token_at_rest(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server_module.url, nats_config)
    store = await RegistrationStore.open(log, sealer)
    assert store.bucket == nats_config.registrations_bucket
    assert await store.get("pod") is None
    await store.put("pod", registration())
    assert await store.get("pod") == registration()
    raw = await raw_value(store, log.js, "pod")
    assert TOKEN.encode() not in raw and b"dynrunner-pod-1" not in raw
    assert b'"key_id":"' + sealer.key_id.encode() in raw
    assert TOKEN not in repr(registration())


async def test_put_replaces_and_delete_forgets(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server_module.url, nats_config)
    store = await RegistrationStore.open(log, sealer)
    await store.put("pod", registration(1))
    await store.put("pod", registration(2))
    await store.put("vm", registration(3))
    assert await store.get("pod") == registration(2)
    await store.delete("pod")
    assert await store.get("pod") is None
    assert await store.get("vm") == registration(3)
    await store.delete("never-armed")  # nothing to forget is fine


async def test_open_is_idempotent(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server_module.url, nats_config)
    first = await RegistrationStore.open(log, sealer)
    await first.put("pod", registration())
    again = await RegistrationStore.open(log.js, sealer, bucket=nats_config.registrations_bucket)
    assert await again.get("pod") == registration()


async def test_value_sealed_with_another_key_or_pool_does_not_open(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server_module.url, nats_config)
    store = await RegistrationStore.open(log, sealer)
    await store.put("pod", registration())
    stranger = await RegistrationStore.open(log, Sealer(bytes(32)))
    with pytest.raises(SealingError, match="sealed with key"):
        await stranger.get("pod")
    kv = await log.js.key_value(store.bucket)
    await kv.put("vm", await raw_value(store, log.js, "pod"))  # copied under another pool's key
    with pytest.raises(SealingError, match="armed-registration/vm"):
        await store.get("vm")
    await kv.put("junk", b"not json")
    with pytest.raises(SealingError, match="is not a sealed record"):
        await store.get("junk")


async def test_survives_a_nats_restart(
    nats_server: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server.url, nats_config)
    await (await RegistrationStore.open(log, sealer)).put("pod", registration())
    nats_server.restart()
    log2 = await open_log(nats_server.url, nats_config)
    assert await (await RegistrationStore.open(log2, sealer)).get("pod") == registration()


async def test_delete_if_removes_only_the_registration_named(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server_module.url, nats_config)
    store = await RegistrationStore.open(log, sealer)
    await store.put("pod", registration(1))
    assert await store.delete_if("pod", 2)  # another one is stored: it stays
    assert await store.get("pod") == registration(1)
    assert await store.delete_if("pod", 1)
    assert await store.get("pod") is None
    assert await store.delete_if("pod", 1)  # nothing stored


async def test_delete_if_leaves_a_registration_stored_after_its_read(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    """The retry that removes a spent runner reads the store, and the claim loop stores the
    next runner before the delete: the delete must not remove the new one."""
    log = await open_log(nats_server_module.url, nats_config)
    store = await RegistrationStore.open(log, sealer)
    await store.put("pod", registration(1))
    entry = store.entry

    async def read_then_replaced(pool: str):  # type: ignore[no-untyped-def]
        stored = await entry(pool)
        await store.put("pod", registration(2))
        return stored

    store.entry = read_then_replaced  # type: ignore[method-assign]
    assert await store.delete_if("pod", 1)
    store.entry = entry  # type: ignore[method-assign]
    assert await store.get("pod") == registration(2)


async def test_listing_does_not_trust_the_key_watcher(
    nats_server_module: NatsServer,
    nats_config: NatsConfig,
    open_log: LogFactory,
    sealer: Sealer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nats-py's `keys()` can answer "no keys" when its watcher's end marker overtakes the
    entries already pushed to the client (seen as a replica with no stored runner while Gitea
    listed six); the listing reads the stream's subjects instead, deletes included."""
    log = await open_log(nats_server_module.url, nats_config)
    store = await RegistrationStore.open(log, sealer)
    for n in (1, 2, 3):
        await store.add("pod", registration(n), owner=f"controller-{n}")
    await store.add("vm", registration(4), owner="controller-1")
    gone = await store.add("pod", registration(5), owner="controller-1")
    await store.remove(gone)

    async def no_keys(*args: object, **kwargs: object) -> list[str]:
        raise nats.js.errors.NoKeysError

    monkeypatch.setattr(KeyValue, "keys", no_keys)
    listed = await store.listing("pod")
    assert sorted((s.registration.id, s.owner) for s in listed) == [
        (1, "controller-1"),
        (2, "controller-2"),
        (3, "controller-3"),
    ]
    assert [s.key for s in await store.listing("vm")] == ["vm.r4"]
    assert await bucket_keys(log.js, store.bucket) == ["pod.r1", "pod.r2", "pod.r3", "pod.r5", "vm.r4"]
