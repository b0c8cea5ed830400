"""A user cancels a running job: the real executor, the local backend, the controller in this
process, against Gitea 1.26 and main (issue 10).

main: the runner declared `cancelling`, so Gitea marks the task cancelling and answers
`RESULT_CANCELLED` to the executor's next UpdateTask; the executor stops the step, runs the
job's `if: always()` steps, reports its last lines and ends the task cancelled.
1.26 (and 1.24, 1.25): `StopTask(task, cancelled)` ends the task at once and deletes the
ephemeral runner, so the executor's next call fails "unregistered runner" (issue 10 item 1):
it takes that as the cancel, stops the step, runs the `if: always()` step here (its output
goes to the executor's own log, Gitea takes no more) and exits as finalized, so the
controller leaves the task alone. Either way the run ends cancelled once and nothing is left
behind: the environment is deleted, its processes stopped, only the armed runners remain in
Gitea, and the controller finalized nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import Result
from tests.fixtures.harness import assert_only_armed_runners, in_process, real_executor_config, wait_for, wait_run_done

WORKFLOW = """
on: push
jobs:
  long:
    runs-on: [self-hosted, local]
    steps:
      - run: |
          echo "working"
          sleep 120
      - if: always()
        run: echo "cleaned up" >> {marker}
"""


@pytest.mark.parametrize("gitea_profile", ["1.26", "main"])
async def test_a_cancelled_job_ends_cancelled_runs_its_cleanup_and_leaves_nothing_behind(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "cleanup"
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state")
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    caplog.set_level(logging.INFO, logger="dynrunner.controller.reporting.finalize")
    async with in_process(cfg) as running:
        run = gitea.submit("acme/app", WORKFLOW.format(marker=marker))
        job = await wait_for(lambda: (j := gitea.jobs(run.id)[0]).task_id and j, what="claim")
        await wait_for(lambda: "working" in gitea.task(job.task_id).log_rows, what="the step ran")
        gitea.cancel_run(run.id)
        done = await wait_run_done(gitea, run.id)
        assert done.status == "cancelled"
        await wait_for(lambda: not any(root.iterdir()), within=30, what="environment deleted")
        await wait_for(lambda: running.controller.pools["local"].capacity.in_use == 0, what="permit released")
        rows = gitea.task(job.task_id).log_rows
        metrics = running.controller.metrics.registry
    assert_only_armed_runners(gitea)
    assert marker.exists(), f"the if: always() step did not run; the job's log ends {rows[-3:]}"
    assert marker.read_text() == "cleaned up\n"
    # The executor's exit said the task needs nobody: the controller did not try to end it again.
    assert metrics.get_sample_value("dynrunner_job_results_total", {"pool": "local", "result": "reported"}) == 1
    assert [r.getMessage() for r in caplog.records if r.name == "dynrunner.controller.reporting.finalize"] == []
    assert not any(row.startswith("[dynrunner]") for row in rows[rows.index("working") :])
    assert gitea.task(job.task_id).result == Result.CANCELLED
