"""The start followers' own bookkeeping stays bounded (what the controller soak measures)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from dynrunner.controller.backends.base import BackendError, Environment, StartEvent
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.launching.starts import RETRY_FOLLOW_S, Starts
from tests.fixtures.backend_memory import MemoryBackend, MemoryWorld, run_forever
from tests.fixtures.controller_samples import make_assignment
from tests.fixtures.nats import MemoryFinalizeRecords
from tests.fixtures.virtual_time import virtual_time


class Unanswered(MemoryBackend):
    """The API errors on every start followed (a backend whose watch cannot be opened)."""

    async def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:
        raise BackendError(f"{env.name}: the API did not answer")
        yield  # pragma: no cover


def test_a_failed_follower_is_not_remembered_once_its_retry_pause_is_over(tmp_path: Path) -> None:
    """Each follower that fails leaves a pause before its environment is handed over again.
    Before, the pause stayed forever for an environment never handed over again (it was reaped
    meanwhile): one entry per failure, for the life of the controller."""

    async def scenario() -> int:
        world = MemoryWorld(lambda _: run_forever())
        backend = Unanswered("p", world)
        starts = Starts(
            "p",
            backend=backend,  # type: ignore[arg-type]
            gitea=None,  # type: ignore[arg-type]
            records=MemoryFinalizeRecords(),
            capacity=Capacity("p", 100),
            metrics=Metrics(),
        )
        for i in range(50):
            env = await backend.create(make_assignment("p", task_id=i + 1))
            starts.follow(env)
            await asyncio.sleep(1.0)
            world.delete(env.assignment_id)  # reaped: never handed over again
        await asyncio.sleep(RETRY_FOLLOW_S)
        env = await backend.create(make_assignment("p", task_id=100))
        starts.follow(env)
        await asyncio.sleep(1.0)
        await starts.aclose()
        return len(starts._retry_after)

    with virtual_time() as runner:
        remembered = runner.run(scenario())
    assert remembered <= 1
