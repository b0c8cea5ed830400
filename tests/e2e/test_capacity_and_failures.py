"""End to end (Gitea double, real nats-server, local backend, real executor): the capacity
limit, publish failures, redelivery after a launcher crash, bad input, leftover registrations.

Every job's step appends a line to `ran.log` in the test's directory, so a job that ran twice
would show twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynrunner.controller.backends.base import Environment
from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import Assignment
from tests.fixtures.backends import DelegatingBackend
from tests.fixtures.harness import (
    REAL_EXECUTOR,
    assert_only_armed_runners,
    in_process,
    live_runners,
    real_executor_config,
    recorded,
    recording_workflow,
    wait_armed,
    wait_for,
    wait_run_done,
)
from tests.fixtures.nats import NatsServer


def workflow(ran: Path, jobs: int = 1, sleep: float = 0) -> str:
    return recording_workflow(ran, jobs, sleep=sleep, suffix=" run $GITHUB_RUN_ID")


async def test_capacity_limit_holds(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    ran = tmp_path / "ran.log"
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state", max_concurrency=2)
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    peak = 0
    async with in_process(cfg) as running:
        capacity = running.controller.pools["local"].capacity
        run = gitea.submit("owner/repo", workflow(ran, jobs=6, sleep=0.4))

        async def sample() -> None:
            nonlocal peak
            while True:
                environments = sum(1 for _ in root.iterdir()) if root.exists() else 0
                executing = sum(1 for j in gitea.jobs(run.id) if j.status == "running")
                peak = max(peak, environments, executing, capacity.in_use)
                await asyncio.sleep(0.01)

        sampler = asyncio.create_task(sample())
        try:
            done = await wait_run_done(gitea, run.id)
        finally:
            sampler.cancel()
        assert done.status == "success"
    assert peak == 2
    assert sorted(recorded(ran)) == sorted(f"job{i} run {run.id}" for i in range(6))


async def test_a_publish_failure_after_the_claim_finalizes_the_task(
    gitea: GiteaDouble, nats_server: NatsServer, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.log"
    cfg = real_executor_config(gitea, nats_server.url, tmp_path / "s", nats={"publishTimeoutSeconds": 1.0})
    async with in_process(cfg) as running:
        # The armed runners in place before NATS goes away: stored, and so polling (one Gitea
        # lists is not yet stored, and a loop whose runner could not be stored never claims).
        await wait_armed(gitea)
        nats_server.stop()
        try:
            run = gitea.submit("owner/repo", workflow(ran))
            done = await wait_run_done(gitea, run.id)
        finally:
            nats_server.start()
        assert done.status == "failure"
        rows = gitea.task(done.jobs[0].task_id).log_rows
        assert any("the job failed: the controller could not queue the job for launch" in r for r in rows), rows
        assert running.controller.metrics.sample("dynrunner_finalized_failed_total", pool="local", reason="publish")
    assert recorded(ran) == []


class CrashAfterCreate(DelegatingBackend):
    """A LocalBackend whose first `create` makes the environment and then hangs, as if the
    launcher died before acknowledging (and before following its start); the test then kills
    that launcher."""

    def __init__(self, inner: LocalBackend) -> None:
        super().__init__(inner)
        self.created = asyncio.Event()
        self.crashed = False

    async def create(self, assignment: Assignment, *, stream_seq: int | None = None) -> Environment:
        env = await self.inner.create(assignment, stream_seq=stream_seq)
        if not self.crashed:
            self.crashed = True
            self.created.set()
            await asyncio.Event().wait()  # hangs until cancelled: no ack, no nak
        return env


async def test_redelivery_after_a_launcher_crash_runs_the_job_once(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.log"
    cfg = real_executor_config(gitea, nats_url, tmp_path / "s", nats={"ackWaitSeconds": 1.0})
    pool = cfg.pools[0]
    assert pool.backend.root_dir is not None
    crashing = CrashAfterCreate(LocalBackend("local", pool.backend.root_dir, [REAL_EXECUTOR]))
    first = in_process(cfg, backends={"local": crashing})
    running = await first.__aenter__()
    run = gitea.submit("owner/repo", workflow(ran, sleep=1.5))
    await asyncio.wait_for(crashing.created.wait(), 30)
    # The launcher dies: its launch is cancelled without ack or nak, then the controller stops.
    launcher = running.controller.pools["local"].launcher
    for launch in list(launcher._launches):
        launch.cancel()
    await first.__aexit__(None, None, None)
    # A new controller finds the environment still starting and starts it (its reaper hands it
    # to a start follower); the assignment comes again after ack-wait, finds the environment,
    # starts nothing twice and is acknowledged; the reaper reaps the one execution.
    async with in_process(cfg):
        done = await wait_run_done(gitea, run.id)
        assert done.status == "success"
        await wait_for(lambda: not any(pool.backend.root_dir.iterdir()), what="environment reaped")  # type: ignore[union-attr]
    assert recorded(ran) == [f"job0 run {run.id}"]
    assert_only_armed_runners(gitea)


async def test_no_registrations_pile_up_across_restarts(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    cfg = real_executor_config(gitea, nats_url, tmp_path / "s")
    for _ in range(3):
        async with in_process(cfg):
            await wait_for(lambda: live_runners(gitea), what="armed runner")
    assert_only_armed_runners(gitea)


async def test_an_invalid_job_key_fails_the_job_with_a_clear_message(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.log"
    cfg = real_executor_config(gitea, nats_url, tmp_path / "s")
    bad = "on: push\njobs:\n  9lives:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: echo\n"
    async with in_process(cfg) as running:
        run = gitea.submit("owner/repo", bad)
        ok = gitea.submit("owner/repo", workflow(ran))
        done = await wait_run_done(gitea, run.id)
        assert done.status == "failure"
        view = gitea.task(done.jobs[0].task_id)
        assert view.log_rows == [
            "[dynrunner] the job failed: job id '9lives' is not a valid job key: it must match "
            "[A-Za-z_][A-Za-z0-9_-]* (a letter or underscore, then letters, digits, '_' or '-'); "
            "rename the job in the workflow"
        ]
        assert view.log_archived
        # Nothing else is affected: the next job runs.
        assert (await wait_run_done(gitea, ok.id)).status == "success"
        assert (
            running.controller.metrics.sample("dynrunner_finalized_failed_total", pool="local", reason="invalid-task")
            == 1.0
        )
    assert recorded(ran) == [f"job0 run {ok.id}"]  # only the valid job ran
