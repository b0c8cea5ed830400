"""Armed runners of several controller replicas in one registration store (real NATS, the
Gitea double): no replica uses another's, a restarted replica reuses its own, the runners of
a replica that is gone are adopted — by exactly one replica each — instead of left in Gitea,
and a replica whose lease lapsed takes its runner again only if nobody adopted it."""

from __future__ import annotations

import asyncio

import pytest

from dynrunner.controller.claiming.registrations import Registrations, Replica
from dynrunner.controller.claiming.registrations_store import RegistrationStore
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient
from tests.fixtures.harness import live_runners

LABELS = ["self-hosted", "local"]


@pytest.fixture
def store(registration_store: RegistrationStore) -> RegistrationStore:
    return registration_store


class Cluster:
    """Which replicas hold their lease, as the lease bucket would say."""

    def __init__(self) -> None:
        self.alive: set[str] = set()

    def replica(self, name: str) -> Replica:
        """A process of replica `name` (a new one each call: a restart under the same name)."""
        self.alive.add(name)
        return Replica(name, alive=self._alive)

    async def _alive(self, other: str) -> bool:
        return other in self.alive


def loops(gitea: GiteaDouble, store: RegistrationStore, replica: Replica, n: int = 2) -> list[Registrations]:
    return [
        Registrations(
            GiteaClient(gitea.url),
            store,
            pool="local",
            labels=LABELS,
            registration_token=gitea.registration_token,
            replica=replica,
        )
        for _ in range(n)
    ]


async def owners(store: RegistrationStore) -> dict[int, str]:
    return {s.registration.id: s.owner for s in await store.listing("local")}


async def test_replicas_never_use_each_others_runners_and_a_restart_reuses_its_own(
    gitea: GiteaDouble, store: RegistrationStore
) -> None:
    cluster = Cluster()
    a = [await r.armed() for r in loops(gitea, store, cluster.replica("a"))]
    b = [await r.armed() for r in loops(gitea, store, cluster.replica("b"))]
    ids = {r.id for r in a + b}
    assert len(ids) == 4 and {r.id for r in live_runners(gitea)} == ids
    assert await owners(store) == {**{r.id: "a" for r in a}, **{r.id: "b" for r in b}}
    # "a" restarted (same name, new objects): its own two runners, none of b's, none new.
    again = [await r.armed() for r in loops(gitea, store, cluster.replica("a"))]
    assert {r.id for r in again} == {r.id for r in a}
    assert len(live_runners(gitea)) == 4


async def test_the_runners_of_a_replica_that_is_gone_are_adopted_not_left_behind(
    gitea: GiteaDouble, store: RegistrationStore
) -> None:
    cluster = Cluster()
    gone = [await r.armed() for r in loops(gitea, store, cluster.replica("controller-7d9f-abcde"))]
    cluster.alive.discard("controller-7d9f-abcde")  # its Pod was replaced: the name never comes back
    successor = loops(gitea, store, cluster.replica("controller-7d9f-xyz12"))
    adopted = [await r.armed() for r in successor]
    assert {r.id for r in adopted} == {r.id for r in gone}  # reused, nothing registered
    assert len(live_runners(gitea)) == 2
    assert set((await owners(store)).values()) == {"controller-7d9f-xyz12"}
    # Each one claims once; the next runners are new, and the adopted ones leave the store.
    for loop, reg in zip(successor, adopted, strict=True):
        loop.spend()
        await loop.forget(reg)
        assert (await loop.armed()).id not in {r.id for r in gone}
    assert not {r.id for r in gone} & set(await owners(store))


async def test_a_runner_two_replicas_adopt_at_once_goes_to_one(gitea: GiteaDouble, store: RegistrationStore) -> None:
    cluster = Cluster()
    [gone] = [await r.armed() for r in loops(gitea, store, cluster.replica("gone"), 1)]
    cluster.alive.discard("gone")
    contenders = [loops(gitea, store, cluster.replica(name), 1)[0] for name in ("b", "c", "d")]
    armed = await asyncio.gather(*(r.armed() for r in contenders))
    assert [r.id for r in armed].count(gone.id) == 1
    assert len({r.id for r in armed}) == 3
    stored = await owners(store)
    assert stored[gone.id] in {"b", "c", "d"} and len(stored) == 3


async def test_a_replica_whose_lease_lapsed_takes_its_runner_again_unless_it_was_adopted(
    gitea: GiteaDouble, store: RegistrationStore
) -> None:
    cluster = Cluster()
    lapsing = _Lapsing("a")
    a = cluster.replica("a")
    a.lease = lapsing  # type: ignore[assignment]
    [loop_a] = loops(gitea, store, a, 1)
    first = await loop_a.armed()
    # The lease lapsed and came back (a new term), nobody adopted meanwhile: same runner.
    lapsing.term += 1
    assert (await loop_a.armed()).id == first.id
    # It lapsed again, long enough for "b" to adopt the runner.
    lapsing.term += 1
    cluster.alive.discard("a")
    [loop_b] = loops(gitea, store, cluster.replica("b"), 1)
    assert (await loop_b.armed()).id == first.id
    cluster.alive.add("a")
    second = await loop_a.armed()
    assert second.id != first.id  # "a" left it to "b" and armed another
    assert (await owners(store)) == {first.id: "b", second.id: "a"}


class _Lapsing:
    """A lease that is held, with a term the test moves."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self.term = 1
        self.held = True

    async def wait_held(self, until: object = None) -> None:
        return None
