"""End to end (Gitea double, real nats-server, local backend): capacity, dying executors,
publish failures, redelivery after a launcher crash, leftover registrations.

The stand-in executor (tests/integration/controller/flow/fake_executor.py) makes these
deterministic: each job's `env.FAKE_EXECUTOR` says whether it succeeds, sleeps, crashes or hangs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path

from dynrunner.controller.backends.base import BeforeStart, Environment, Observation
from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import Assignment
from tests.e2e.harness import (
    assert_only_armed_runners,
    build_config,
    fake_executor_command,
    in_process,
    live_runners,
    wait_for,
    wait_run_done,
)
from tests.fixtures.nats import NatsServer


def workflow(behaviour: str = "succeed", jobs: int = 1) -> str:
    body = "\n".join(
        f"""  job{i}:
    runs-on: [self-hosted, local]
    env:
      FAKE_EXECUTOR: "{behaviour}"
    steps:
      - run: echo {i}"""
        for i in range(jobs)
    )
    return f"on: push\njobs:\n{body}\n"


def starts(state: Path) -> list[str]:
    path = state / "local" / "starts.log"
    return path.read_text().split("\n")[:-1] if path.exists() else []


async def test_capacity_limit_holds(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = build_config(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=state,
        nats_url=nats_url,
        max_concurrency=2,
    )
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    peak = 0
    async with in_process(cfg) as running:
        capacity = running.controller.pools["local"].capacity
        run = gitea.submit("owner/repo", workflow("sleep:0.4", jobs=6))

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
    assert len(starts(state)) == 6


async def test_an_executor_that_dies_gets_its_task_finalized(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    async with in_process(cfg) as running:
        run = gitea.submit("owner/repo", workflow("crash"), secrets={"TOKEN_X": "crashing on purpose"})
        done = await wait_run_done(gitea, run.id)
        assert done.status == "failure"
        view = gitea.task(done.jobs[0].task_id)
        text = "\n".join(view.log_rows)
        assert "the job failed: the executor exited with status 3 before it reported the job's result" in text
        assert "[executor-failed]" in text
        # The executor's last output is shown, with the task's secrets masked.
        assert "fake executor: *** " not in text and "fake executor: ***" in text
        assert view.log_archived
        await wait_for(lambda: running.controller.pools["local"].capacity.in_use == 0, what="permit released")
        assert (
            running.controller.metrics.sample(
                "dynrunner_finalized_failed_total", pool="local", reason="executor-failed"
            )
            == 1.0
        )
    # The spent runner was deleted by Gitea with the final UpdateTask; only the armed one is left.
    assert_only_armed_runners(gitea)


async def test_a_publish_failure_after_the_claim_finalizes_the_task(
    gitea: GiteaDouble, nats_server: NatsServer, tmp_path: Path
) -> None:
    cfg = build_config(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "s",
        nats_url=nats_server.url,
        nats={"publishTimeoutSeconds": 1.0},
    )
    async with in_process(cfg) as running:
        # Make sure the armed runner is in place before NATS goes away.
        await wait_for(lambda: live_runners(gitea), what="armed runner")
        nats_server.stop()
        try:
            run = gitea.submit("owner/repo", workflow())
            done = await wait_run_done(gitea, run.id)
        finally:
            nats_server.start()
        assert done.status == "failure"
        rows = gitea.task(done.jobs[0].task_id).log_rows
        assert any("the job failed: the controller could not queue the job for launch" in r for r in rows), rows
        assert running.controller.metrics.sample("dynrunner_finalized_failed_total", pool="local", reason="publish")
    assert starts(tmp_path / "s") == []


class CrashAfterCreate:
    """A LocalBackend whose first `create` makes the environment and then hangs, as if the
    launcher died before acknowledging; the test then kills that launcher."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.created = asyncio.Event()
        self.crashed = False

    async def create(self, assignment: Assignment, before_start: BeforeStart) -> Environment:
        env = await self.inner.create(assignment, before_start)
        if not self.crashed:
            self.crashed = True
            self.created.set()
            await asyncio.Event().wait()  # hangs until cancelled: no ack, no nak
        return env

    async def find(self, assignment_id: str) -> Environment | None:
        return await self.inner.find(assignment_id)

    async def list_owned(self) -> list[Environment]:
        return await self.inner.list_owned()

    async def observe(self, env: Environment) -> Observation:
        return await self.inner.observe(env)

    async def load_assignment(self, env: Environment) -> Assignment:
        return await self.inner.load_assignment(env)

    async def delete(self, env: Environment) -> None:
        await self.inner.delete(env)

    async def collect_orphans(self, launching: Collection[str]) -> list[str]:
        return await self.inner.collect_orphans(launching)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_redelivery_after_a_launcher_crash_runs_the_job_once(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "s"
    cfg = build_config(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=state,
        nats_url=nats_url,
        nats={"ackWaitSeconds": 1.0},
    )
    pool = cfg.pools[0]
    assert pool.backend.root_dir is not None
    crashing = CrashAfterCreate(LocalBackend("local", pool.backend.root_dir, fake_executor_command()))
    first = in_process(cfg, backends={"local": crashing})
    running = await first.__aenter__()
    run = gitea.submit("owner/repo", workflow("sleep:1.5"))
    await asyncio.wait_for(crashing.created.wait(), 30)
    # The launcher dies: its launch is cancelled without ack or nak, then the controller stops.
    launcher = running.controller.pools["local"].launcher
    for launch in list(launcher._launches):
        launch.cancel()
    await first.__aexit__(None, None, None)
    # A new controller gets the assignment again after ack-wait; the environment exists, so
    # it only acknowledges it, and the reaper reaps the one execution.
    async with in_process(cfg):
        done = await wait_run_done(gitea, run.id)
        assert done.status == "success"
        await wait_for(lambda: not any(pool.backend.root_dir.iterdir()), what="environment reaped")  # type: ignore[union-attr]
    assert len(starts(state)) == 1
    assert_only_armed_runners(gitea)


async def test_no_registrations_pile_up_across_restarts(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    for _ in range(3):
        async with in_process(cfg):
            await wait_for(lambda: live_runners(gitea), what="armed runner")
    assert_only_armed_runners(gitea)


async def test_an_invalid_job_key_fails_the_job_with_a_clear_message(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    bad = "on: push\njobs:\n  9lives:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: echo\n"
    async with in_process(cfg) as running:
        run = gitea.submit("owner/repo", bad)
        ok = gitea.submit("owner/repo", workflow())
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
    assert len(starts(tmp_path / "s")) == 1  # only the valid job was launched
