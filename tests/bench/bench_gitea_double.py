"""Throughput of the Gitea double through the real client (figures only, no assertions on time).

Run: `make bench` or `.venv/bin/python -m pytest -q -s tests/bench/test_gitea_double_bench.py`.
Every authenticated RPC costs one PBKDF2 of the runner token, as on Gitea; the
`pbkdf2_iterations` option trades that fidelity for throughput in load tests.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.gitea_calls import final_state, job, register, workflow

RUNNERS = 16
DURATION_S = 0.75


@pytest.mark.parametrize("iterations", [10_000, 1])
async def test_rpc_throughput(gitea_factory: GiteaFactory, iterations: int) -> None:
    async with gitea_factory(pbkdf2_iterations=iterations) as gitea:
        runners = [await register(gitea, name=f"r{i}") for i in range(RUNNERS)]
        version = (await runners[0].fetch_task(0)).tasks_version

        async def poll(runner: object) -> int:
            calls, deadline = 0, time.perf_counter() + DURATION_S
            while time.perf_counter() < deadline:
                await runner.fetch_task(version)  # type: ignore[attr-defined]
                calls += 1
            return calls

        started = time.perf_counter()
        polls = sum(await asyncio.gather(*(poll(r) for r in runners)))
        poll_rate = polls / (time.perf_counter() - started)

        jobs = 200
        gitea.submit("owner/repo", workflow(*(job(f"j{i}") for i in range(jobs))))

        async def work(runner: object) -> int:
            done, deadline = 0, time.perf_counter() + 2 * DURATION_S
            while time.perf_counter() < deadline:
                fetched = await runner.fetch_task(0)  # type: ignore[attr-defined]
                if fetched.task is None:
                    break
                await runner.update_task(final_state(fetched.task.id))  # type: ignore[attr-defined]
                done += 1
            return done

        started = time.perf_counter()
        done = sum(await asyncio.gather(*(work(r) for r in runners)))
        cycle_rate = done / (time.perf_counter() - started)
        finished = sum(1 for j in gitea.jobs(1) if j.status == "success")
        assert finished == done  # every claim was reported once
        print(
            f"\ngitea double, {RUNNERS} concurrent runners, pbkdf2_iterations={iterations}: "
            f"FetchTask fast path {poll_rate:.0f}/s; claim+final UpdateTask {cycle_rate:.0f} jobs/s "
            f"({2 * cycle_rate:.0f} RPC/s)"
        )
