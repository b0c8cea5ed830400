"""What the Backend seam's handshake and watch cost and save (issue 9, items 1 and 2).

  reaper   N idle local environments (a sleeping executor each), watched for S seconds:
           the reaper as before — `list_owned` + one `observe` per environment every second —
           against the backend's watch (one pass over the root per second) waking the reaper,
           which then looks at nothing (a full sweep every 30 s). Backend calls per second and
           this process's CPU per second, for each.
  slots    K jobs whose environment takes P seconds to start (an image pull, observed as
           start events), launched through 2 launch slots against the Gitea double: how long
           each launch holds its slot, and how long until every delivery is acknowledged —
           next to what holding a slot for the start would take (ceil(K/2) x P).

Figures are printed, never asserted.

    .venv/bin/python -m pytest -q -s tests/bench/bench_backend_seam.py
DYNRUNNER_BENCH_N (default 200), DYNRUNNER_BENCH_S (default 10), DYNRUNNER_BENCH_K (default 10),
DYNRUNNER_BENCH_PULL_S (default 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dynrunner.controller.backends.base import Environment, Observation, StartEvent, StartStage
from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.controller.claiming.claimer import ClaimSettings, build_assignment
from dynrunner.controller.claiming.registrations_store import ArmedRegistration
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.controller.launching.launcher import Launcher
from dynrunner.controller.reaping.reaper import PoolWatch, Reaper
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import Assignment, ClaimingRunner
from dynrunner.proto.gitea import GiteaClient, RunnerCredentials, Task
from tests.fixtures.backends import DelegatingBackend
from tests.fixtures.harness import fake_executor_command
from tests.fixtures.local_backend import launch, script
from tests.fixtures.nats import MemoryFinalizeRecords, MemoryLaunchRecord

SEALER = Sealer(b"b" * 32)
WORKFLOW = "on: push\njobs:\n  build:\n    runs-on: [self-hosted]\n    steps:\n      - run: echo\n"


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


class Counting(DelegatingBackend):
    def __init__(self, inner: LocalBackend) -> None:
        super().__init__(inner)
        self.calls = 0

    async def list_owned(self) -> list[Environment]:
        self.calls += 1
        return await self.inner.list_owned()

    async def observe(self, env: Environment) -> Observation:
        self.calls += 1
        return await self.inner.observe(env)

    async def find(self, assignment_id: str) -> Environment | None:
        self.calls += 1
        return await self.inner.find(assignment_id)


def idle_assignment() -> Assignment:
    return Assignment(
        assignment_id=str(uuid.uuid4()),
        pool="bench",
        backend="local",
        claimed_at=datetime.now(UTC),
        task=Task(id=1, context={"repository": "o/r", "job": "idle"}),
        runner=ClaimingRunner(id=1, uuid="u", token="t", name="r"),
        gitea_url="http://gitea.invalid",
        job_key="idle",
    )


async def measure(backend: Counting, reaper: Reaper, seconds: float, watch: bool) -> tuple[float, float]:
    """Backend calls per second and CPU milliseconds per second over `seconds` (after warm-up)."""
    tasks = [asyncio.create_task(reaper.run())]
    if watch:
        tasks.append(asyncio.create_task(backend.inner.watch(lambda aid: reaper.wake("bench", aid))))  # type: ignore[attr-defined]
    await asyncio.sleep(2.5)  # the first full sweep and the watch's first passes
    calls, cpu, wall = backend.calls, time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    calls, cpu, wall = backend.calls - calls, time.process_time() - cpu, time.monotonic() - wall
    reaper.stop()
    for task in tasks[1:]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return calls / wall, 1000 * cpu / wall


async def test_reaper_cost_with_idle_environments(tmp_path: Path) -> None:
    n, seconds = env_int("DYNRUNNER_BENCH_N", 200), env_int("DYNRUNNER_BENCH_S", 10)
    local = LocalBackend(
        "bench", tmp_path / "root", script(tmp_path, "exec sleep 3600\n"), base_env={"PATH": os.defpath}
    )
    envs = [await launch(local, idle_assignment()) for _ in range(n)]
    try:
        figures = {}
        for mode, watched in (("polling (before)", False), ("watch (after)", True)):
            backend = Counting(local)
            capacity = Capacity("bench", n + 1)
            pool = PoolWatch("bench", backend, capacity, lambda: (), records=MemoryFinalizeRecords(), watched=watched)  # type: ignore[arg-type]
            reaper = Reaper([pool], gitea=None, metrics=Metrics())  # type: ignore[arg-type]
            figures[mode] = await measure(backend, reaper, seconds, watched)
        print(f"\nreaper with {n} idle local environments, {seconds} s each:")
        for mode, (calls, cpu) in figures.items():
            print(f"  {mode:18} backend calls {calls:8.1f}/s   CPU {cpu:6.1f} ms/s")
        (_, before_cpu), (_, after_cpu) = figures.values()
        print(f"  ratio (before/after): CPU x{before_cpu / max(after_cpu, 0.01):.1f}")
    finally:
        for env in envs:
            await local.delete(env)


class SlowPull(DelegatingBackend):
    """A start observed while an image is pulled for `pull_s` (then the executor starts)."""

    def __init__(self, inner: LocalBackend, pull_s: float, jobs: int) -> None:
        super().__init__(inner)
        self.pull_s = pull_s
        self.jobs = jobs
        self.started: dict[str, float] = {}
        self.all_started = asyncio.Event()

    async def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:
        began = time.monotonic()
        yield StartEvent(StartStage.PROGRESS, "pulling image registry.example/executor:1")
        await asyncio.sleep(self.pull_s)
        yield StartEvent(StartStage.PROGRESS, f"image pulled in {time.monotonic() - began:.1f}s")
        async for event in self.inner.follow_start(env):
            if event.stage.final:
                self.started[env.assignment_id] = time.monotonic() - began
                if len(self.started) == self.jobs:
                    self.all_started.set()
                yield event


class Delivery:
    def __init__(self, sealed: Any, seq: int) -> None:
        self.assignment, self.stream_seq = sealed, seq
        self.num_delivered, self.max_deliver = 1, 5
        self.acked_at: float | None = None

    is_last_attempt = exhausted = False

    @contextlib.asynccontextmanager
    async def keep_alive(self, interval_s: float | None = None) -> AsyncIterator[None]:
        yield

    async def ack(self) -> None:
        self.acked_at = time.monotonic()

    async def nak(self, delay_s: float | None = None) -> None:
        raise AssertionError("a launch failed")

    term = nak


async def claimed(gitea: GiteaDouble, k: int) -> list[Any]:
    base = GiteaClient(gitea.url)
    sealed = []
    for i in range(k):
        info = await base.register(
            name=f"r{i}", registration_token=gitea.registration_token, labels=["self-hosted"], ephemeral=True
        )
        gitea.submit("owner/repo", WORKFLOW)
        fetched = await base.with_credentials(RunnerCredentials(info.uuid, info.token)).fetch_task(0)
        assert fetched.task is not None
        reg = ArmedRegistration(info.id, info.uuid, info.token, info.name, ("self-hosted",), datetime.now(UTC))
        settings = ClaimSettings(pool="local", backend="local", gitea_url=gitea.url)
        a = build_assignment(
            fetched.task, assignment_id=str(uuid.uuid4()), claimed_at=datetime.now(UTC), runner=reg, settings=settings
        )
        sealed.append(SEALER.seal_assignment(a))
    return sealed


async def test_launch_slots_during_slow_starts(gitea: GiteaDouble, tmp_path: Path) -> None:
    k, pull_s = env_int("DYNRUNNER_BENCH_K", 10), float(os.environ.get("DYNRUNNER_BENCH_PULL_S") or 2)
    backend = SlowPull(LocalBackend("local", tmp_path / "root", fake_executor_command()), pull_s, k)
    launcher = Launcher(
        "local",
        backend=backend,
        source=None,  # type: ignore[arg-type]
        sealer=SEALER,
        record=MemoryLaunchRecord(),
        records=MemoryFinalizeRecords(),
        gitea=GiteaClient(gitea.url),
        capacity=Capacity("local", k),
        metrics=Metrics(),
        concurrency=2,
    )
    slots = asyncio.Semaphore(2)  # what Launcher.run does with `concurrency`
    held: list[float] = []

    async def one(delivery: Delivery) -> None:
        async with slots:
            began = time.monotonic()
            await launcher._launch(delivery)  # type: ignore[arg-type]
            held.append(time.monotonic() - began)

    deliveries = [Delivery(s, i + 1) for i, s in enumerate(await claimed(gitea, k))]
    began = time.monotonic()
    await asyncio.gather(*(one(d) for d in deliveries))
    all_acked = max(d.acked_at or 0 for d in deliveries) - began
    await asyncio.wait_for(backend.all_started.wait(), 60 + 2 * pull_s)
    all_started = time.monotonic() - began
    starts = list(backend.started.values())
    print(f"\n{k} jobs, each start {pull_s:g} s (an image pull), 2 launch slots:")
    print(f"  launch slot held per job   p50 {1000 * statistics.median(held):7.1f} ms   max {1000 * max(held):7.1f} ms")
    print(f"  start per job              p50 {statistics.median(starts):7.2f} s")
    print(f"  every delivery acknowledged after {all_acked:6.2f} s; every executor started after {all_started:6.2f} s")
    print(f"  holding a slot for the start would take {math.ceil(k / 2) * pull_s:6.2f} s to start them all")
    await launcher.starts.aclose()
