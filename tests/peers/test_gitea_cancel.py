"""A user cancels a running job through Gitea's web route, on real Gitea 1.24, 1.25 and 1.26.

The cancel is the Cancel button's request: a logged-in session, `POST
/{owner}/{repo}/actions/runs/{run}/cancel` with the run's index on 1.24 and 1.25 (and their
CSRF token) and its ID on 1.26 (docs/real-peers.md). None of these releases knows the
`cancelling` state: Gitea ends the task, its job and unfinished steps at once and deletes the
ephemeral runner, so the executor's next call is refused and it takes that as the cancel
(docs/compatibility.md). What must hold on the real server: the job's `if: always()` step ran
(it writes a file on this host: Gitea takes no more lines), the task ended cancelled once, the
controller finalized nothing, and nothing is left (environment, permit, runners: only the
armed ones, listed through the admin API).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path

import pytest

from dynrunner.controller.app import CLAIM_LOOPS
from tests.fixtures.real_gitea import RealGitea, Run
from tests.fixtures.real_gitea_faults import (
    cancel_latest,
    controller_in_loop,
    controller_settings,
    environments_root,
    eventually,
    live_runners,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ORGS = itertools.count(1)

WORKFLOW = """\
on: push
jobs:
  long:
    runs-on: [self-hosted, local]
    steps:
      - name: long
        run: |
          echo "working"
          sleep 300
          echo "reached the end after $((60 * 5))s"
      - name: cleanup
        if: always()
        run: echo "cleaned up" >> {marker}
"""


def running_with_log(gitea: RealGitea, repo: str, needle: str) -> Run | None:
    run = gitea.read_run(repo, logs=False)
    if run is None or not run.jobs or run.jobs[0].status != "running":
        return None
    return run if needle in gitea.job_log(repo, run.jobs[0].id) else None


@pytest.mark.parametrize("route", ["run", "latest"])
async def test_a_cancel_through_the_web_route_runs_the_cleanup_and_leaves_nothing(
    real_gitea: RealGitea, tmp_path: Path, caplog: pytest.LogCaptureFixture, route: str
) -> None:
    """`route`: the run's own reference (index before 1.26, ID from 1.26), or `latest`."""
    gitea = real_gitea
    started = time.monotonic()
    org = f"cancel{next(ORGS)}"
    await asyncio.to_thread(gitea.create_org, org)
    repo = await asyncio.to_thread(gitea.create_repo, org, "app")
    marker = tmp_path / "cleanup"
    settings = controller_settings(gitea, tmp_path)
    root = environments_root(settings)
    before = {r["id"] for r in await asyncio.to_thread(live_runners, gitea)}
    caplog.set_level(logging.INFO, logger="dynrunner.controller.reporting.finalize")
    async with controller_in_loop(settings) as controller:
        await asyncio.to_thread(gitea.commit_file, repo, ".gitea/workflows/long.yml", WORKFLOW.format(marker=marker))
        run = await eventually(lambda: running_with_log(gitea, repo, "working"), within=120, what="the long step")
        cancelled_at = time.monotonic()
        if route == "latest":
            await asyncio.to_thread(cancel_latest, gitea, repo)
        else:
            await asyncio.to_thread(gitea.cancel, repo, run)
        done = await eventually(lambda: (r := gitea.read_run(repo)) and r.done and r, within=60, what="the run's end")
        await eventually(marker.exists, within=60, what="the if: always() step")
        cleanup_s = time.monotonic() - cancelled_at
        await eventually(lambda: root.is_dir() and not any(root.iterdir()), within=60, what="environment deleted")
        pool = controller.pools["local"]
        await eventually(lambda: pool.capacity.in_use == 0, within=30, what="permit released")
        results = controller.metrics.sample("dynrunner_job_results_total", pool="local", result="reported")
        runners = await asyncio.to_thread(live_runners, gitea)
    tasks = await asyncio.to_thread(gitea.tasks, repo)
    [job] = done.jobs
    log = job.log.splitlines()
    assert done.status == "cancelled" and job.status == "cancelled", done
    assert [(t["status"], t["name"]) for t in tasks] == [("cancelled", "long")]  # one task, ended once
    assert [s.status for s in job.steps] == ["cancelled", "cancelled"], job.steps
    assert marker.read_text() == "cleaned up\n", "the if: always() step ran more than once"
    assert not any("reached the end after 300s" in row for row in log)  # the step was stopped
    working = next(i for i, row in enumerate(log) if "working" in row)
    assert not any("[dynrunner]" in row for row in log[working:]), log[working:]
    # The executor's exit said the task needs nobody: the controller did not end it again.
    assert results == 1
    assert [r.getMessage() for r in caplog.records if r.name == "dynrunner.controller.reporting.finalize"] == []
    mine = [r for r in runners if r["id"] not in before]
    assert len(mine) == CLAIM_LOOPS, mine  # the armed ones, kept for the next claims
    assert all(r.get("ephemeral", True) and not r.get("busy") for r in mine), mine
    print(
        f"\nGitea {gitea.version}: cancelled through the web route ({route}); cleanup ran "
        f"{cleanup_s:.1f}s after the cancel; test {time.monotonic() - started:.0f}s"
    )
