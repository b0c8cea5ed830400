"""The launcher and the start followers stop on their flag even when a request in flight
swallows the cancellation meant to stop them (Python 3.11's `asyncio.wait_for` can, under
nats-py's requests): before, the launcher pulled on and a follower followed on, and the
controller's stop waited for them for good."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from dynrunner.controller.assignments.finalize_records import FinalizeRecord
from dynrunner.controller.backends.base import Environment, StartEvent
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.loops import Stopping
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.controller.launching.launcher import Launcher
from dynrunner.controller.launching.starts import Starts
from dynrunner.proto.assignment import SealedAssignment
from dynrunner.proto.gitea import GiteaClient
from tests.fixtures.backend_memory import MemoryBackend, MemoryWorld, run_forever
from tests.fixtures.controller_samples import make_assignment
from tests.fixtures.lost_cancel import LostCancel, ended
from tests.fixtures.nats import MemoryFinalizeRecords, MemoryLaunchRecord


@dataclass
class Answered:
    """A delivery the pull answered as it was cancelled: sealed with a key this controller
    does not hold, so the launcher only gives it back."""

    assignment: SealedAssignment
    num_delivered: int = 1
    max_deliver: int = 3
    stream_seq: int = 1
    naks: int = 0

    @property
    def is_last_attempt(self) -> bool:
        return False

    @property
    def exhausted(self) -> bool:
        return False

    def keep_alive(self, interval_s: float | None = None) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def ack(self) -> None:
        pass

    async def nak(self, delay_s: float | None = None) -> None:
        self.naks += 1

    async def term(self) -> None:
        pass


class LosingSource:
    """Deliveries as `AssignmentLog.deliveries` makes them: the first pull loses the
    cancellation and answers; idle pulls after it expire and are sent again until `stopping`."""

    def __init__(self, answer: Answered) -> None:
        self.lost = LostCancel()
        self.answer = answer

    async def deliveries(
        self, pool: str, batch: int | Callable[[], int] = 1, stopping: Stopping | None = None
    ) -> AsyncGenerator[Answered, None]:
        yield await self.lost.answer(self.answer)
        await (stopping or asyncio.Event()).wait()  # idle pulls expire and are sent again until then


async def test_the_launcher_stops_when_its_pull_swallows_the_cancellation() -> None:
    foreign = Sealer(b"f" * 32).seal_assignment(make_assignment("p"))
    source = LosingSource(Answered(foreign))
    capacity, records = Capacity("p", 4), MemoryFinalizeRecords()
    launcher = Launcher(
        "p",
        backend=MemoryBackend("p", MemoryWorld(lambda _: run_forever())),  # type: ignore[arg-type]
        source=source,  # type: ignore[arg-type]
        sealer=Sealer(b"s" * 32),
        record=MemoryLaunchRecord(),
        records=records,
        gitea=GiteaClient("http://127.0.0.1:9"),
        capacity=capacity,
        metrics=Metrics(),
    )
    running = asyncio.create_task(launcher.run())
    await source.lost.waiting.wait()
    launcher.stop()
    running.cancel()
    assert await ended(running), "the launcher pulled on after its stop"
    assert source.lost.lost == 1
    assert source.answer.naks == 1  # the answer was handled (given back), not dropped


class NeverStarts(MemoryBackend):
    """An image pull that never ends: the start reports nothing."""

    async def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:
        await asyncio.Event().wait()
        yield  # type: ignore[misc]  # pragma: no cover


class LosingRecords(MemoryFinalizeRecords):
    """The finalize record's read (a NATS request) loses the cancellation and answers none."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = LostCancel()

    async def get(self, assignment_id: str) -> FinalizeRecord | None:
        return await self.lost.answer(None)


async def test_a_start_follower_stops_when_a_request_swallows_the_cancellation() -> None:
    backend = NeverStarts("p", MemoryWorld(lambda _: run_forever()))
    records = LosingRecords()
    starts = Starts(
        "p",
        backend=backend,  # type: ignore[arg-type]
        gitea=GiteaClient("http://127.0.0.1:9"),
        records=records,
        capacity=Capacity("p", 4),
        metrics=Metrics(),
    )
    env = await backend.create(make_assignment("p"))
    assert starts.follow(env)
    await records.lost.waiting.wait()
    closing = asyncio.create_task(starts.aclose())
    assert await ended(closing), "the follower followed on after the stop"
    assert records.lost.lost == 1
    assert len(starts) == 0
