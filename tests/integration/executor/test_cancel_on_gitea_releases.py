"""A cancel on Gitea 1.24-1.26, which have no `cancelling` state (issue 10 item 1).

`CancelJobs` ends the task, its job and its unfinished steps at once and deletes the
ephemeral runner, so the executor's next call is refused "unregistered runner". The executor
takes that as the job cancelled: it stops the running step (its process group), runs the
`if: always()`/`cancelled()` steps and post stages here, writes their output (masked) to its
stderr since Gitea takes no more, and exits as finalized. A passing failure on the way to
Gitea (a front end's 5xx page, Gitea restarting) is no cancel. On `main` the cancel is
answered `RESULT_CANCELLED` instead and everything is reported (test_cancel_and_timeouts.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from pathlib import Path

import pytest

from dynrunner.executor.run import RunOptions
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness, UnreportedCapture, fast_options, process_gone
from tests.fixtures.faults import fault_proxy

OLDER_RELEASES = ["1.24", "1.25", "1.26"]


@pytest.fixture
def gitea_profile() -> str:
    return "1.26"


def options(stderr: UnreportedCapture) -> RunOptions:
    base = fast_options()
    return dataclasses.replace(base, reporter=dataclasses.replace(base.reporter, unreported_output=stderr))


MID_STEP = """
on: push
jobs:
  cancel-me:
    runs-on: self-hosted
    steps:
      - id: long
        run: |
          sleep 300 & echo $! > {pid_file}
          echo started
          wait
      - run: echo "not after a cancel"
      - if: always()
        run: |
          echo "always ran, long was ${{{{ steps.long.outcome }}}}, token ${{{{ secrets.TOKEN }}}}"
          echo cleaned > {marker}
      - if: cancelled()
        run: echo "cancelled() ran with job status ${{{{ job.status }}}}"
      - if: failure()
        run: echo "failure() is false after a cancel"
"""


@pytest.mark.parametrize("gitea_profile", OLDER_RELEASES)
async def test_a_cancel_that_deletes_the_runner_mid_step_runs_the_cleanup_here(
    executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    gitea = executor_harness.gitea
    pid_file, marker = tmp_path / "child.pid", tmp_path / "cleanup"
    claimed = await executor_harness.claim(
        MID_STEP.format(pid_file=pid_file, marker=marker), secrets={"TOKEN": "s3cr3t-value"}
    )
    stderr = UnreportedCapture()
    running = asyncio.create_task(executor_harness.run(claimed, options(stderr)))
    await executor_harness.wait_for_log(claimed.task_id, "started")
    started = time.monotonic()
    gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0  # finalized: nobody has to end the task
    assert time.monotonic() - started < 10
    assert process_gone(pid_file)
    assert marker.read_text() == "cleaned\n"
    task = gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert [s.status for s in task.steps] == ["cancelled"] * 5  # as Gitea's cancel left them
    assert "started" in task.log_rows and "##[error]The operation was canceled." not in task.log_rows
    rows = stderr.rows(claimed.task_id)
    assert "##[error]The operation was canceled." in rows
    assert "always ran, long was cancelled, token ***" in rows
    assert "cancelled() ran with job status cancelled" in rows
    assert "not after a cancel" not in rows and "failure() is false after a cancel" not in rows
    assert rows[-1] == "Job cancelled"
    assert "s3cr3t-value" not in stderr.text
    assert "its runner is gone" in stderr.text and "unregistered runner" in stderr.text
    assert [r.name for r in gitea.runners()] == []  # Gitea deleted the ephemeral runner with its task


async def test_with_a_shared_runner_the_task_no_longer_running_is_the_cancel_and_the_cleanup_is_reported(
    executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    """`credentialMode: shared` on 1.26: the ordinary runner outlives the cancel, so the next
    UpdateTask answers with the task already ended (RESULT_CANCELLED) and the log still takes
    rows until the executor completes it."""
    gitea = executor_harness.gitea
    pid_file, marker = tmp_path / "child.pid", tmp_path / "cleanup"
    run = gitea.submit("owner/repo", MID_STEP.format(pid_file=pid_file, marker=marker), secrets={"TOKEN": "s3cr3t"})
    claimed = await executor_harness.claim_waiting(run, ephemeral=False)
    stderr = UnreportedCapture()
    running = asyncio.create_task(executor_harness.run(claimed, options(stderr)))
    await executor_harness.wait_for_log(claimed.task_id, "started")
    gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    assert process_gone(pid_file) and marker.read_text() == "cleaned\n"
    task = gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert "always ran, long was cancelled, token ***" in task.log_rows
    assert task.log_rows[-1] == "Job cancelled"
    assert stderr.text == ""


CHATTY = """
on: push
jobs:
  chatty:
    runs-on: self-hosted
    steps:
      - run: |
          i=0
          while true; do i=$((i+1)); echo "tick $i"; done
      - if: always()
        run: echo "cleanup after the ticks"
"""


async def test_a_cancel_while_reports_are_on_their_way_loses_no_row(executor_harness: ExecutorHarness) -> None:
    """Every row the step printed is in Gitea's log or on stderr, in order, once."""
    gitea = executor_harness.gitea
    claimed = await executor_harness.claim(CHATTY)
    stderr = UnreportedCapture()
    running = asyncio.create_task(executor_harness.run(claimed, options(stderr)))
    await executor_harness.wait_for_log(claimed.task_id, "tick 1")
    gitea.cancel_run(claimed.run.id)  # the step is still printing: reports follow each other
    assert await asyncio.wait_for(running, 30) == 0
    reported = [row for row in gitea.task(claimed.task_id).log_rows if re.fullmatch(r"tick \d+", row)]
    unreported = [row for row in stderr.rows(claimed.task_id) if re.fullmatch(r"tick \d+", row)]
    ticks = reported + unreported
    assert unreported  # the step printed until it was stopped
    assert ticks == [f"tick {i}" for i in range(1, len(ticks) + 1)]
    assert stderr.rows(claimed.task_id)[-2:] == ["cleanup after the ticks", "Job cancelled"]


FLOOD = """
on: push
jobs:
  flood:
    runs-on: self-hosted
    steps:
      - run: |
          echo started
          yes flood
      - if: always()
        run: echo "cleanup after the flood"
"""


async def test_a_step_whose_output_never_pauses_is_stopped_after_the_cancel(executor_harness: ExecutorHarness) -> None:
    """Its pipe never runs dry; once its rows go to stderr nothing slows it down, and the
    executor must still get round to stopping it (it hung before)."""
    claimed = await executor_harness.claim(FLOOD)
    stderr = UnreportedCapture()
    running = asyncio.create_task(executor_harness.run(claimed, options(stderr)))
    await executor_harness.wait_for_log(claimed.task_id, "flood")
    executor_harness.gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    assert stderr.rows(claimed.task_id)[-2:] == ["cleanup after the flood", "Job cancelled"]


POST_ACTION = {
    "slowpost/action.yml": "runs:\n  using: node20\n  main: main.js\n  post: post.js\n",
    "slowpost/main.js": "console.log('main of slowpost');\n",
    "slowpost/post.js": (
        "console.log('post started');\n"
        "setTimeout(() => {\n"
        "  require('fs').writeFileSync(process.env.MARKER, 'post finished');\n"
        "  console.log('post finished');\n"
        "}, 1500);\n"
    ),
    "first/action.yml": "runs:\n  using: node20\n  main: main.js\n  post: post.js\n",
    "first/main.js": "console.log('main of first');\n",
    "first/post.js": "console.log(`post of first, job ${process.env.JOB_STATUS}`);\n",
}

DURING_POST = """
on: push
jobs:
  posts:
    runs-on: self-hosted
    env:
      MARKER: {marker}
    steps:
      - uses: ./first
        env:
          JOB_STATUS: ${{{{ job.status }}}}
      - uses: ./slowpost
"""


async def test_a_cancel_during_a_post_stage_lets_it_and_the_later_ones_finish(
    executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    gitea = executor_harness.gitea
    marker = tmp_path / "post"
    claimed = await executor_harness.claim(DURING_POST.format(marker=marker), files=POST_ACTION)
    stderr = UnreportedCapture()
    running = asyncio.create_task(executor_harness.run(claimed, options(stderr)))
    await executor_harness.wait_for_log(claimed.task_id, "post started")
    gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    assert marker.read_text() == "post finished"
    rows = stderr.rows(claimed.task_id)
    assert "post finished" in rows
    assert any(row.startswith("post of first") for row in rows)  # the earlier action's post, after
    assert rows[-1] == "Job cancelled"
    assert gitea.task(claimed.task_id).result == Result.CANCELLED


PASSING_FAILURES = """
on: push
jobs:
  steady:
    runs-on: self-hosted
    steps:
      - run: |
          echo started
          sleep 2
          echo "finished while Gitea was away"
      - if: cancelled()
        run: echo "cancelled() must not run"
      - if: always()
        run: echo "always ran"
"""


@pytest.mark.parametrize("failure", [500, 502, "down"], ids=["front-end-500-page", "bad-gateway", "gitea-restart"])
async def test_a_passing_failure_of_gitea_is_no_cancel(executor_harness: ExecutorHarness, failure: int | str) -> None:
    gitea = executor_harness.gitea
    claimed = await executor_harness.claim(PASSING_FAILURES)
    stderr = UnreportedCapture()
    async with fault_proxy(gitea.url) as proxy:
        assignment = dataclasses.replace(claimed.assignment, gitea_url=proxy.url)
        running = asyncio.create_task(executor_harness.run(assignment, options(stderr)))
        await executor_harness.wait_for_log(claimed.task_id, "started")
        if failure == "down":
            await proxy.down()
        else:
            assert isinstance(failure, int)
            proxy.fail_with(failure)
        await asyncio.sleep(1.0)  # heartbeats (every 0.25 s) and log reports fail meanwhile
        if failure == "down":
            await proxy.up()
        else:
            proxy.heal()
        assert await asyncio.wait_for(running, 30) == 0
    task = gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS, task.log_rows[-10:]
    assert [s.status for s in task.steps] == ["success", "skipped", "success"]
    assert "finished while Gitea was away" in task.log_rows and "always ran" in task.log_rows
    assert stderr.text == ""
