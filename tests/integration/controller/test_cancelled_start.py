"""A run cancelled while its environment starts is counted once, as cancelled: the reaper that
then finds the environment gone knows from its consumed finalize record that its task was
settled (before, it said another replica had reaped it, and without the replicas' leases
it counted the job vanished too)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.backends import PULLING, EndlessPull
from tests.fixtures.harness import build_config, fake_executor_command, in_process, wait_for, wait_run_done

WORKFLOW = "on: push\njobs:\n  build:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: echo hi\n"


async def test_a_run_cancelled_during_its_start_is_counted_cancelled_not_vanished(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynrunner")
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    backend = EndlessPull(LocalBackend("local", root, fake_executor_command()))
    async with in_process(cfg, backends={"local": backend}) as running:
        run = gitea.submit("owner/repo", WORKFLOW)
        await wait_for(
            lambda: any(
                PULLING in row
                for job in gitea.run(run.id).jobs
                if job.task_id
                for row in gitea.task(job.task_id).log_rows
            ),
            what="the start being followed",
        )
        gitea.cancel_run(run.id)
        done = await wait_run_done(gitea, run.id)
        assert done.status == "cancelled"
        pool = running.controller.pools["local"]
        await wait_for(lambda: not any(root.iterdir()) and pool.capacity.in_use == 0, what="the environment removed")
        reaper = "dynrunner.controller.reaping.reaper"
        await wait_for(lambda: any(r.name == reaper for r in caplog.records), what="the reaper's look at it")
        said = [r.getMessage() for r in caplog.records if r.name == reaper]
        assert not any("another replica" in line or "no finalize record" in line for line in said), said
        metrics = running.controller.metrics
        assert metrics.sample("dynrunner_job_results_total", pool="local", result="cancelled") == 1.0
        assert metrics.sample("dynrunner_job_results_total", pool="local", result="vanished") is None
