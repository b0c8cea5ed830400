"""The whole flow with the fake executor: claim → publish → launch → execute → reap."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import (
    assert_only_armed_runners,
    build_config,
    fake_executor_command,
    in_process,
    wait_for,
    wait_run_done,
)

WORKFLOW = """
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    steps:
      - run: echo hi
"""


async def test_one_job_runs_and_is_reaped(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    cfg = build_config(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "state",
        nats_url=nats_url,
    )
    async with in_process(cfg) as running:
        run = gitea.submit("owner/repo", WORKFLOW)
        done = await wait_run_done(gitea, run.id)
        task = gitea.task(done.jobs[0].task_id)
        assert done.status == "success", "\n".join(task.log_rows)
        task = gitea.task(done.jobs[0].task_id)
        assert any("claimed by pool local" in row for row in task.log_rows)
        assert any("fake executor ran job build" in row for row in task.log_rows)
        pool = running.controller.pools["local"]
        await wait_for(lambda: pool.capacity.in_use == 0, what="capacity released")
        root = cfg.pools[0].backend.root_dir
        assert root is not None
        await wait_for(lambda: not any(root.iterdir()), what="environment deleted")
    # One armed runner is left for the next claim; the spent one was deleted by Gitea.
    assert_only_armed_runners(gitea)


async def test_an_executor_that_exits_without_finalizing_is_reported(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    """The stand-in executor exits 3 without reporting: the controller finalizes the task,
    showing the executor's last output with the task's secrets masked."""
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    crash = WORKFLOW.replace("steps:", "env: {FAKE_EXECUTOR: crash}\n    steps:")
    async with in_process(cfg) as running:
        run = gitea.submit("owner/repo", crash, secrets={"TOKEN_X": "crashing on purpose"})
        done = await wait_run_done(gitea, run.id)
        assert done.status == "failure"
        view = gitea.task(done.jobs[0].task_id)
        text = "\n".join(view.log_rows)
        assert "the job failed: the executor exited with status 3 before it reported the job's result" in text
        assert "[executor-failed]" in text
        assert "[dynrunner] fake executor: ***" in text and "crashing on purpose" not in text
        assert view.log_archived
        await wait_for(lambda: running.controller.pools["local"].capacity.in_use == 0, what="permit released")
        failed = running.controller.metrics.sample(
            "dynrunner_finalized_failed_total", pool="local", reason="executor-failed"
        )
        assert failed == 1.0
    assert_only_armed_runners(gitea)


async def test_jobs_go_to_the_pool_whose_labels_they_ask_for(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    command = fake_executor_command()
    pools = [
        {"name": name, "labels": ["self-hosted", name], "backend": {"kind": "local", "executorCommand": command}}
        for name in ("pod", "vm")
    ]
    cfg = build_config(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "s",
        nats_url=nats_url,
        pools=pools,
    )
    two = (
        "on: push\njobs:\n"
        "  vmjob:\n    runs-on: [self-hosted, vm]\n    steps: [{run: x}]\n"
        "  podjob:\n    runs-on: [self-hosted, pod]\n    steps: [{run: x}]\n"
    )
    async with in_process(cfg):
        run = gitea.submit("owner/repo", two)
        done = await wait_run_done(gitea, run.id)
        assert done.status == "success"
        for job in done.jobs:
            first = gitea.task(job.task_id).log_rows[0]
            pool = job.job_id.removesuffix("job")
            assert first.startswith(f"[dynrunner] claimed by pool {pool} as runner dynrunner-{pool}-"), first
    assert_only_armed_runners(gitea, pools=2)


async def test_a_pool_timeout_beyond_what_gitea_enforces_is_warned_about_once(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Gitea stops every task after ENDLESS_TASK_TIMEOUT (3 h), whatever timeout-minutes says."""
    pools = [
        {"name": name, "labels": ["self-hosted", name], "backend": {"kind": "local"}, **extra}
        for name, extra in (("long", {"jobTimeoutMinutes": 360}), ("default", {}))
    ]
    cfg = build_config(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "state",
        nats_url=nats_url,
        pools=pools,
    )
    assert cfg.pool("default").job_timeout_minutes == 180
    with caplog.at_level(logging.WARNING, logger="dynrunner.controller.app"):
        async with in_process(cfg):
            pass
    warnings = [r.getMessage() for r in caplog.records if "ENDLESS_TASK_TIMEOUT" in r.getMessage()]
    assert warnings == [
        "pool long: jobTimeoutMinutes is 360, but Gitea stops every task that runs longer than its [actions] "
        "ENDLESS_TASK_TIMEOUT (180 minutes unless raised in app.ini, checked every 30 minutes), whatever the job's "
        "timeout-minutes: raise that setting as well, or such jobs fail after 180 to 210 minutes"
    ]
