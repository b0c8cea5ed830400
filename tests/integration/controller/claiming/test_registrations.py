"""Arming ephemeral runners against the Gitea double, with the armed one kept in JetStream KV."""

from __future__ import annotations

import asyncio

import pytest

from dynrunner.controller.claiming.registrations import GiteaTooOld, Registrations, Replica, StoreUnreachable
from dynrunner.controller.claiming.registrations_store import ArmedRegistration, RegistrationStore, runner_key
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, RunnerInfo
from tests.fixtures.harness import live_runners
from tests.fixtures.nats import NatsServer

LABELS = ["self-hosted", "local"]


@pytest.fixture
def store(registration_store: RegistrationStore) -> RegistrationStore:
    return registration_store


def registrations(
    gitea: GiteaDouble, store: RegistrationStore, client: GiteaClient | None = None, replica: Replica | None = None
) -> Registrations:
    return Registrations(
        client or GiteaClient(gitea.url),
        store,
        pool="local",
        labels=LABELS,
        registration_token=gitea.registration_token,
        replica=replica or Replica.alone(),
    )


async def stored_ids(store: RegistrationStore) -> list[int]:
    return sorted(s.registration.id for s in await store.listing("local"))


async def test_arms_one_ephemeral_runner_and_reuses_it_after_a_restart(
    gitea: GiteaDouble, store: RegistrationStore
) -> None:
    first = await registrations(gitea, store).armed()
    [runner] = live_runners(gitea)
    assert runner.ephemeral and runner.labels == LABELS and runner.id == first.id
    assert first.name.startswith("dynrunner-local-")
    # A restarted controller (new objects, same store) claims with the same runner.
    again = await registrations(gitea, store).armed()
    assert again == first
    assert len(live_runners(gitea)) == 1
    assert await store.get(runner_key("local", first.id)) == first


async def test_a_spent_runner_is_forgotten_and_the_next_one_armed(gitea: GiteaDouble, store: RegistrationStore) -> None:
    regs = registrations(gitea, store)
    first = await regs.armed()
    regs.spend()
    second = await regs.armed()
    assert second.id != first.id
    assert await stored_ids(store) == [first.id, second.id]  # each under its own key
    await regs.forget(first)  # the claim retires the spent one after publishing
    assert await stored_ids(store) == [second.id]


async def test_a_spent_runner_retired_before_the_next_one_is_stored(
    gitea: GiteaDouble, store: RegistrationStore
) -> None:
    regs = registrations(gitea, store)
    first = await regs.armed()
    regs.spend()
    await regs.forget(first)
    assert await stored_ids(store) == []
    second = await regs.armed()
    assert second.id != first.id and await stored_ids(store) == [second.id]


async def test_a_runner_gitea_forgot_is_replaced(gitea: GiteaDouble, store: RegistrationStore) -> None:
    """An armed runner deleted in Gitea (by an admin) fails Declare: arm a new one."""
    first = await registrations(gitea, store).armed()
    with gitea.engine.store.write() as conn:
        conn.execute("UPDATE runner SET deleted = 1 WHERE id = ?", (first.id,))
    second = await registrations(gitea, store).armed()
    assert second.id != first.id
    assert [r.id for r in live_runners(gitea)] == [second.id]


class _OldGitea(GiteaClient):
    """Gitea < 1.24 has no `ephemeral` field: Register answers with an ordinary runner."""

    async def register(self, **kwargs: object) -> RunnerInfo:  # type: ignore[override]
        info = await super().register(**kwargs)  # type: ignore[arg-type]
        return RunnerInfo(id=info.id, uuid=info.uuid, token=info.token, name=info.name, ephemeral=False)


async def test_refuses_gitea_without_ephemeral_runners(gitea: GiteaDouble, store: RegistrationStore) -> None:
    regs = registrations(gitea, store, _OldGitea(gitea.url))
    with pytest.raises(GiteaTooOld) as err:
        await regs.armed()
    message = str(err.value)
    [runner] = live_runners(gitea)
    assert "1.24" in message and runner.name in message and f"id {runner.id}" in message
    assert "credentialMode: shared" in message
    assert await stored_ids(store) == []


async def test_shared_mode_keeps_one_ordinary_runner(gitea: GiteaDouble, store: RegistrationStore) -> None:
    regs = Registrations(
        GiteaClient(gitea.url),
        store,
        pool="local",
        labels=LABELS,
        registration_token=gitea.registration_token,
        mode="shared",
        replica=Replica.alone(),
    )
    first = await regs.armed()
    regs.spend()
    assert await regs.armed() == first
    [runner] = live_runners(gitea)
    assert not runner.ephemeral


async def test_the_next_arm_after_a_spent_runner_does_not_read_the_store(
    gitea: GiteaDouble, store: RegistrationStore
) -> None:
    """Right after a claim, arming again only registers (no listing of the store per claim);
    the store is looked at again after `LOOK_INTERVAL_S`, and by a fresh object."""
    now = [0.0]
    regs = Registrations(
        GiteaClient(gitea.url),
        store,
        pool="local",
        labels=LABELS,
        registration_token=gitea.registration_token,
        replica=Replica.alone(),
        clock=lambda: now[0],
    )
    await regs.armed()
    regs.spend()
    listings: list[str] = []
    original = store.listing

    async def counting(pool: str):  # type: ignore[no-untyped-def]
        listings.append(pool)
        return await original(pool)

    store.listing = counting  # type: ignore[method-assign]
    second = await regs.armed()
    assert listings == []
    regs.spend()
    now[0] += 11
    await regs.armed()
    assert listings == ["local"]
    assert second.id in await stored_ids(store)


async def test_a_runner_the_store_did_not_take_is_stored_later_not_registered_again(
    gitea: GiteaDouble, store: RegistrationStore
) -> None:
    """NATS down for longer than a KV request waits: Register succeeded, the put did not.
    Each retry of the claim loop stores that same runner instead of registering another
    (Gitea never removes an ephemeral runner that claimed nothing), and it is used only
    once stored."""
    regs = registrations(gitea, store)
    original = store.add
    failures = [3]

    async def failing_add(pool: str, reg: ArmedRegistration, owner: str):  # type: ignore[no-untyped-def]
        if failures[0]:
            failures[0] -= 1
            raise TimeoutError("nats: timeout")
        return await original(pool, reg, owner)

    store.add = failing_add  # type: ignore[method-assign]
    for _ in range(3):
        with pytest.raises(TimeoutError):
            await regs.armed()
    armed = await regs.armed()
    assert [r.id for r in live_runners(gitea)] == [armed.id]
    assert await stored_ids(store) == [armed.id]
    # Also after a claim, while the spent runner is still stored.
    regs.spend()
    failures[0] = 2
    for _ in range(2):
        with pytest.raises(TimeoutError):
            await regs.armed()
    second = await regs.armed()
    assert second.id != armed.id
    assert [r.id for r in live_runners(gitea) if r.id != armed.id] == [second.id]
    assert await stored_ids(store) == [armed.id, second.id]


async def test_no_runner_is_registered_while_the_store_is_unreachable(
    gitea: GiteaDouble, nats_server: NatsServer, store: RegistrationStore
) -> None:
    """NATS down after a claim: the loop registers nothing it could not keep (each such runner
    would stay in Gitea for good), and registers one runner once NATS is back."""
    regs = registrations(gitea, store)
    first = await regs.armed()
    regs.spend()
    nats_server.stop()
    await asyncio.sleep(0.1)  # the client notices
    for _ in range(3):
        with pytest.raises(StoreUnreachable):
            await regs.armed()
    assert [r.id for r in live_runners(gitea)] == [first.id]
    nats_server.start()
    second = await asyncio.wait_for(_armed_once_connected(regs), 15)
    assert [r.id for r in live_runners(gitea)] == [first.id, second.id]
    assert second.id in await stored_ids(store)


async def _armed_once_connected(regs: Registrations) -> ArmedRegistration:
    while True:
        try:
            return await regs.armed()
        except StoreUnreachable:
            await asyncio.sleep(0.05)
