"""The `opensandbox` backend's costs (figures only, no assertions on time). Run: `make bench`.

1. Claim → VM ready: JOBS one-step jobs through the whole controller (Gitea double, real
   nats-server, the OpenSandbox double booting the VM image, the SPIRE Server API double);
   for each job, from the claim (the assignment's `claimed_at`) to `create` returning (the
   sandbox made, running, the delivery staged in it) and to the executor started; p50/p99.
2. API calls per job: OpenSandbox requests by kind and SPIRE RPCs, divided by the jobs.
3. Renewals per hour per job: RUNNING jobs kept running for a virtual hour (the double's
   clock, which the backend reads, moved a minute at a time), with the default lease.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dynrunner.controller.backends.base import Environment, StartEvent, StartStage, Wake
from dynrunner.controller.backends.opensandbox.backend import OpenSandboxBackend
from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import Assignment
from tests.fixtures.backends import DelegatingBackend
from tests.fixtures.harness import config_data, in_process, wait_for, wait_run_done
from tests.fixtures.opensandbox_backend import as_built_for, vm_assignment, vm_world

JOBS = 20
BOUGHT = ("POST /sandboxes", "DELETE /sandboxes/{id}", "POST /sandboxes/{id}/renew-expiration")
"""What running a job must cost; the bench reports every other request beside it."""
RUNNING = 10


class Timed(DelegatingBackend):
    """Records, per assignment, when create returned and when the executor started."""

    def __init__(self, inner: OpenSandboxBackend) -> None:
        super().__init__(inner)
        self.claimed: dict[str, datetime] = {}
        self.created: dict[str, datetime] = {}
        self.started: dict[str, datetime] = {}

    async def create(self, assignment: Assignment, *, stream_seq: int | None = None) -> Environment:
        env = await super().create(assignment, stream_seq=stream_seq)
        self.claimed[assignment.assignment_id] = assignment.claimed_at
        self.created.setdefault(assignment.assignment_id, datetime.now(UTC))
        return env

    async def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:  # type: ignore[override]
        async for event in self.inner.follow_start(env):
            if event.stage is StartStage.STARTED:
                self.started.setdefault(env.assignment_id, datetime.now(UTC))
            yield event

    async def watch(self, wake: Wake) -> None:
        assert isinstance(self.inner, OpenSandboxBackend)
        await self.inner.watch(wake)


def _percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered) * 1000:7.1f} ms   p99 {p99 * 1000:7.1f} ms"


async def test_claim_to_vm_and_calls_per_job(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    (tmp_path / "vm").mkdir()
    async with vm_world(tmp_path / "vm") as world:
        data: dict[str, Any] = config_data(
            gitea_url=gitea.url,
            registration_token=gitea.registration_token,
            state_dir=tmp_path / "state",
            nats_url=nats_url,
            pools=[{**world.pool(), "maxConcurrency": 8}],
        )
        cfg = ControllerConfig.model_validate({**data, "identity": world.identity()})
        inner = OpenSandboxBackend.from_config(cfg.pools[0], cfg)
        timed = Timed(inner)
        body = "\n".join(
            f"  job{i}:\n    runs-on: [self-hosted, vm]\n    steps:\n      - run: echo {i}" for i in range(JOBS)
        )
        began = time.monotonic()
        async with in_process(cfg, backends={"vm": timed}):  # type: ignore[dict-item]
            run = gitea.submit("owner/repo", f"on: push\njobs:\n{body}\n")
            done = await wait_run_done(gitea, run.id, within=600)
            await wait_for(lambda: not world.osb.listed(), within=60, what="every VM deleted")
            osb_calls = dict(inner.api.requests)
            osb_calls["list"] -= inner.watcher.lists
            served = dict(world.osb.requests)
            served["GET /sandboxes"] -= inner.watcher.lists
            spire_calls = inner.agents.sent if inner.agents is not None else 0
        took = time.monotonic() - began
    assert done.status == "success"
    created = [(timed.created[a] - timed.claimed[a]).total_seconds() for a in timed.created]
    started = [(timed.started[a] - timed.claimed[a]).total_seconds() for a in timed.started]
    print(f"\nopensandbox backend, {JOBS} one-step jobs, maxConcurrency 8, doubles in-process ({took:.1f}s):")
    print(f"  claim → VM made, running, delivery staged  {_percentiles(created)}")
    print(f"  claim → executor started                   {_percentiles(started)}")
    total = sum(osb_calls.values())
    by_kind = ", ".join(f"{k} {v / JOBS:.2f}" for k, v in sorted(osb_calls.items()))
    print(f"  OpenSandbox API requests per job: {total / JOBS:.1f} ({by_kind})")
    beyond = {k: v for k, v in served.items() if k not in BOUGHT and v}
    print(
        f"  as the server saw them: {sum(served.values()) / JOBS:.1f} per job; beyond create, delete and renew "
        f"{sum(beyond.values()) / JOBS:.1f} ({', '.join(f'{k} {v / JOBS:.2f}' for k, v in sorted(beyond.items()))})"
    )
    print(
        f"  the pool's watch: {inner.watcher.lists} lists in {took:.0f}s "
        "(one per pollIntervalSeconds, 0.1 here, and per 200 VMs)"
    )
    print(f"  SPIRE Server RPCs per job: {spire_calls / JOBS:.1f}")


async def test_renewals_per_hour_per_job(tmp_path: Path) -> None:
    (tmp_path / "vm").mkdir()
    async with vm_world(tmp_path / "vm") as world:
        cfg = ControllerConfig.model_validate(
            {
                "gitea": {"url": "http://gitea.invalid", "registrationToken": "t"},
                "pools": [world.pool(identity=False)],
                "stateDir": str(tmp_path / "state"),
            }
        )
        backend = OpenSandboxBackend.from_config(cfg.pools[0], cfg, clock=world.osb.clock.now)
        config = backend.settings.backend
        lease = config.lease_s
        envs = []
        for _ in range(RUNNING):
            env = await backend.create(as_built_for(vm_assignment(), config))
            async for _event in backend.follow_start(env):
                pass
            envs.append(env)
        watching = asyncio.create_task(backend.watch(lambda _aid: None))
        lists_before = backend.watcher.lists
        for _minute in range(60):
            expired = await world.osb.advance(60)
            assert not expired, "a running job's VM expired: it was not renewed"
            synced = backend.watcher.lists
            await wait_for(lambda: backend.watcher.lists >= synced + 2, what="two looks at the new time")  # noqa: B023
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        renewals = backend.watcher.renewals
        lists = backend.watcher.lists - lists_before
        for env in envs:
            await backend.delete(env)
        await backend.aclose()
    print(f"\nrenewals, {RUNNING} running jobs, one virtual hour, leaseSeconds {lease}:")
    print(f"  {renewals / RUNNING:.1f} renewals per hour per job ({renewals} in all)")
    print(f"  {lists} lists by the pool's watch (the test let it look twice per virtual minute)")
