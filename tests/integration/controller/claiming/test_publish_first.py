"""A claim is published before anything else is awaited (issue 14, item 5).

Until JetStream acknowledges the assignment, a controller killed loses the claim; so the
claimer logs the task id, then builds, seals and publishes at once, and only then retires the
spent runner from the registration store. Here the store stops answering right after the
loop armed its runner: the claim is published all the same, within milliseconds (before the
fix it first waited for the store's delete, up to RETIRE_TIMEOUT_S), and the spent runner
leaves the store once it answers again — without ever deleting the next runner stored over it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.claiming.build import ClaimSettings
from dynrunner.controller.claiming.claimer import Claimer
from dynrunner.controller.claiming.registrations import Registrations, Replica
from dynrunner.controller.claiming.registrations_store import RegistrationStore
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import SealedAssignment
from tests.fixtures.gitea_inprocess import InProcessGitea
from tests.fixtures.kv_memory import MemoryKeyValue

WORKFLOW = "on: push\njobs:\n  build:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: true\n"


class StallingKeyValue(MemoryKeyValue):
    """A bucket that stops answering while `stalled` (its calls wait until it is cleared)."""

    def __init__(self) -> None:
        super().__init__()
        self.answering = asyncio.Event()
        self.answering.set()
        self.stalled_calls = 0

    async def _answer(self) -> None:
        if not self.answering.is_set():
            self.stalled_calls += 1
            await self.answering.wait()

    async def get(self, key: str, revision: int | None = None, validate_keys: bool = True) -> Any:
        await self._answer()
        return await super().get(key, revision, validate_keys)

    async def put(self, key: str, value: bytes, validate_keys: bool = True) -> int:
        await self._answer()
        return await super().put(key, value, validate_keys)

    async def keys(self, filters: list[str] | None = None, **kwargs: object) -> list[str]:
        await self._answer()
        return await super().keys(filters, **kwargs)

    async def purge(self, key: str, msg_ttl: float | None = None) -> bool:
        await self._answer()
        return await super().purge(key, msg_ttl)

    async def delete(self, key: str, last: int | None = None, validate_keys: bool = True) -> bool:
        await self._answer()
        return await super().delete(key, last, validate_keys)


class TimedGitea(InProcessGitea):
    """Notes when FetchTask answered with a task."""

    claimed_at: float | None = None

    def call(self, method: str, fn: Any, *args: Any) -> Any:
        result = super().call(method, fn, *args)
        if method == "FetchTask" and result.HasField("task"):
            self.claimed_at = asyncio.get_running_loop().time()
        return result


class Recorder:
    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog
        self.published: list[tuple[float, SealedAssignment, list[str]]] = []

    async def publish(self, sealed_assignment: SealedAssignment) -> int:
        seen = [r.getMessage() for r in self._caplog.records]
        self.published.append((asyncio.get_running_loop().time(), sealed_assignment, seen))
        return len(self.published)


async def test_a_claim_is_published_before_the_store_answers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dynrunner.controller")
    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1)
    gitea = TimedGitea(double)
    kv = StallingKeyValue()
    store = RegistrationStore(kv, Sealer(secrets.token_bytes(32)), "registrations")  # type: ignore[arg-type]
    regs = Registrations(
        gitea.client(),  # type: ignore[arg-type]
        store,
        pool="local",
        labels=["self-hosted", "local"],
        registration_token=double.registration_token,
        replica=Replica.alone(),
    )
    publisher = Recorder(caplog)
    sealer = Sealer(secrets.token_bytes(32))
    claimer = Claimer(
        ClaimSettings(pool="local", backend="local", gitea_url=double.url, fetch_interval_s=0.01),
        registrations=regs,
        capacity=Capacity("local", 2),
        publisher=publisher,
        sealer=sealer,
        metrics=Metrics(),
    )
    running = asyncio.create_task(claimer.run())
    try:
        spent = await asyncio.wait_for(regs.armed(), 5)
        kv.answering.clear()  # the store (NATS) stops answering
        run = double.submit("owner/repo", WORKFLOW)
        for _ in range(500):
            if publisher.published:
                break
            await asyncio.sleep(0.01)
        assert publisher.published, "the claim was not published while the store did not answer"
        published_at, sealed, logged = publisher.published[0]
        assignment = sealer.unseal_assignment(sealed)
        assert gitea.claimed_at is not None
        assert published_at - gitea.claimed_at < 0.5
        assert assignment.task.context_get("run_id") == str(run.id)
        assert f"claimed task {assignment.task.id} as runner {spent.name} (id {spent.id})" in logged
        assert kv.stalled_calls >= 1  # the retirement (and the next runner's store) wait for it
        kv.answering.set()  # back: the spent runner leaves, the next one is stored
        for _ in range(500):
            stored = [s.registration.id for s in await store.listing("local")]
            if stored and spent.id not in stored:
                break
            await asyncio.sleep(0.01)
        assert len(stored) == 1 and spent.id not in stored  # the next runner, never deleted
    finally:
        kv.answering.set()
        claimer.stop()
        await asyncio.wait_for(running, 10)
        double.close()
    assert [s.registration.id for s in await store.listing("local")] == stored
