"""End to end (Gitea double, real nats-server, local backend, real executor): an environment
removed behind the controller's back mid-job — its processes killed and its directory
deleted, as `kubectl delete pod` or a lost node does to a Pod — gets its task finalized
failed with the reason within seconds, from the finalize record (the environment's copy of
the credentials went with it), instead of running until Gitea's zombie reaper gives up on it.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from dynrunner.controller.backends.local.layout import Layout
from dynrunner.controller.reaping.reaper import RESYNC_INTERVAL_S
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import (
    assert_only_armed_runners,
    in_process,
    real_executor_config,
    recorded,
    recording_workflow,
    wait_for,
    wait_run_done,
)


async def test_a_job_whose_environment_vanished_is_finalized_with_the_reason(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.log"
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state")
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    async with in_process(cfg) as running:
        run = gitea.submit("owner/repo", recording_workflow(ran, sleep=300))
        await wait_for(lambda: recorded(ran), within=60, what="the job's step running")
        [env_dir] = [p for p in root.iterdir() if not p.name.startswith(".")]
        layout = Layout(env_dir)
        wrapper = layout.read_int(layout.pid_file)
        assert wrapper is not None
        os.killpg(wrapper, signal.SIGKILL)  # the job's processes and its directory go at once
        shutil.rmtree(env_dir)
        vanished_at = time.monotonic()
        done = await wait_run_done(gitea, run.id, within=30)
        took = time.monotonic() - vanished_at
        metrics = running.controller.metrics
        # Gitea shows the run done once the final UpdateTask is in; the reaper counts it after.
        await wait_for(
            lambda: metrics.sample("dynrunner_finalized_failed_total", pool="local", reason="vanished") == 1,
            what="the vanished job counted",
        )
    assert done.status == "failure"
    task = gitea.task(done.jobs[0].task_id)
    assert task.log_rows[-1] == (
        "[dynrunner] the job failed: the job's environment disappeared before its executor reported "
        "the job's result (deleted by someone else, or lost with its machine) [vanished]"
    )
    # Nothing is left of the executor's report to tell how far the job got: every step ends
    # cancelled (Gitea kept the step's start and log range, if it had them), none stays running.
    assert [step.status for step in task.steps] == ["cancelled"], task.steps
    assert took < RESYNC_INTERVAL_S, f"noticed after {took:.1f} s: by a resync, not by the watch"
    assert_only_armed_runners(gitea)
