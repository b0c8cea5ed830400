"""The claim loops of one replica never share a stored armed runner, even when one of them
takes it while the other confirms it with Gitea (issue 18, item 6).

A restarted replica's loops look at the store and each takes a runner it finds: taking is a
compare-and-set, then Declare asks Gitea whether the runner still exists. A sibling that
looked while that Declare was on its way found the runner taken by its own replica and not
yet held, took it too, and both loops polled with it: Gitea gives a runner no task while
its task runs, so a runner that holds a claim a kill lost kept the whole pool from claiming
until Gitea's zombie timeout. Here the first loop's Declare is held (`InProcessGitea.hold`)
until the second loop has armed or is held there too.
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dynrunner.controller.claiming.registrations import Registrations, Replica
from dynrunner.controller.claiming.registrations_store import ArmedRegistration, RegistrationStore
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.gitea_inprocess import InProcessGitea
from tests.fixtures.harness import live_runners
from tests.fixtures.kv_memory import MemoryKeyValue

LABELS = ["self-hosted", "local"]


@pytest.fixture
def double(tmp_path: Path) -> GiteaDouble:
    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1)
    yield double
    double.close()


def loops(gitea: InProcessGitea, store: RegistrationStore, replica: Replica, n: int = 2) -> list[Registrations]:
    return [
        Registrations(
            gitea.client(),  # type: ignore[arg-type]
            store,
            pool="local",
            labels=LABELS,
            registration_token=gitea.double.registration_token,
            replica=replica,
        )
        for _ in range(n)
    ]


async def stored_runner(gitea: InProcessGitea, store: RegistrationStore, kept_as: str) -> ArmedRegistration:
    """A runner armed by an earlier process: of replica "a" (`own`), of a replica that is gone
    (`gone`), or stored before replicas under the pool's name (`unowned`)."""
    if kept_as == "unowned":
        info = await gitea.client().register(
            name="before-replicas", registration_token=gitea.double.registration_token, labels=LABELS, ephemeral=True
        )
        reg = ArmedRegistration(info.id, info.uuid, info.token, info.name, tuple(LABELS), datetime.now(UTC))
        await store.put("local", reg)
        return reg
    [earlier] = loops(gitea, store, Replica("a" if kept_as == "own" else "gone"), 1)
    return await earlier.armed()


@pytest.mark.parametrize("kept_as", ["own", "gone", "unowned"])
async def test_a_sibling_looking_while_a_stored_runner_is_confirmed_arms_another(
    double: GiteaDouble, kept_as: str
) -> None:
    gitea = InProcessGitea(double)
    store = RegistrationStore(MemoryKeyValue(), Sealer(secrets.token_bytes(32)), "registrations")  # type: ignore[arg-type]
    kept = await stored_runner(gitea, store, kept_as)

    first, second = loops(gitea, store, Replica("a"))  # the restarted process of replica "a"
    declare = gitea.hold("Declare")
    taking = asyncio.create_task(first.armed())
    await declare.arrived()  # the first loop took the stored runner and asks Gitea about it
    looking = asyncio.create_task(second.armed())
    held_too = asyncio.create_task(declare.arrived(2))
    await asyncio.wait({looking, held_too}, return_when=asyncio.FIRST_COMPLETED)  # armed, or took it as well
    held_too.cancel()
    declare.open()
    reused, other = await asyncio.gather(taking, looking)

    assert reused.id == kept.id
    assert other.id != kept.id  # before: the same runner, for both loops
    assert {r.id for r in live_runners(double)} == {kept.id, other.id}
    assert {s.registration.id: s.owner for s in await store.listing("local")} == {kept.id: "a", other.id: "a"}
