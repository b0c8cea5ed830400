"""Stopping a job: Gitea's cancellation, step and job `timeout-minutes`, the assignment's deadline.

Each stops the running step's whole process group; the test's step starts a background
child and writes its pid, so the test can check that the child is gone too.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dynrunner.doubles.gitea.views import TaskView
from dynrunner.executor.steps import StepRun
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness, process_gone


def rows_of(task: TaskView, index: int) -> list[str]:
    step = task.steps[index]
    return task.log_rows[step.log_index : step.log_index + step.log_length]


def long_step(pid_file: Path) -> str:
    return f"""sleep 300 & echo $! > {pid_file}
          echo started
          wait"""


async def test_cancel_stops_the_step_and_runs_always_and_cancelled_steps(
    executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    workflow = f"""
on: push
jobs:
  cancel-me:
    runs-on: self-hosted
    steps:
      - id: long
        run: |
          {long_step(pid_file)}
      - run: echo "not after a cancel"
      - if: always()
        run: echo "always ran, long was ${{{{ steps.long.outcome }}}}"
      - if: cancelled()
        run: echo "cancelled() ran with job status ${{{{ job.status }}}}"
      - if: failure()
        run: echo "failure() is false after a cancel"
"""
    claimed = await executor_harness.claim(workflow)
    running = asyncio.create_task(executor_harness.run(claimed))
    await executor_harness.wait_for_log(claimed.task_id, "started")
    started = time.monotonic()
    executor_harness.gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    assert time.monotonic() - started < 10
    assert process_gone(pid_file)
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert [s.status for s in task.steps] == ["cancelled", "skipped", "success", "success", "skipped"]
    assert "##[error]The operation was canceled." in rows_of(task, 0)
    assert rows_of(task, 2)[-1] == "always ran, long was cancelled"
    assert rows_of(task, 3)[-1] == "cancelled() ran with job status cancelled"
    assert task.log_rows[-1] == "Job cancelled"


async def test_a_running_always_step_keeps_running_after_a_cancel(executor_harness: ExecutorHarness) -> None:
    workflow = """
on: push
jobs:
  cleanup:
    runs-on: self-hosted
    steps:
      - if: always()
        run: |
          echo started
          sleep 2
          echo "finished despite the cancel"
"""
    claimed = await executor_harness.claim(workflow)
    running = asyncio.create_task(executor_harness.run(claimed))
    await executor_harness.wait_for_log(claimed.task_id, "started")
    executor_harness.gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert task.steps[0].status == "success"
    assert rows_of(task, 0)[-1] == "finished despite the cancel"


async def test_step_timeout_fails_the_step_and_stops_its_group(
    executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    workflow = f"""
on: push
jobs:
  slow:
    runs-on: self-hosted
    steps:
      - name: Slow step
        timeout-minutes: 0.02
        run: |
          {long_step(pid_file)}
      - if: failure()
        run: echo "failure() after the timeout"
      - timeout-minutes: ${{{{ 0.01 }}}}
        continue-on-error: true
        run: sleep 30
"""
    claimed = await executor_harness.claim(workflow)
    started = time.monotonic()
    assert await executor_harness.run(claimed) == 0
    assert time.monotonic() - started < 15
    assert process_gone(pid_file)
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert [s.status for s in task.steps] == ["failure", "success", "skipped"]
    assert rows_of(task, 0)[-1] == "##[error]The action 'Slow step' has timed out after 0.02 minutes."
    assert rows_of(task, 1)[-1] == "failure() after the timeout"


async def test_job_timeout_fails_the_job_then_always_steps_run(
    executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    workflow = f"""
on: push
jobs:
  bounded:
    runs-on: self-hosted
    timeout-minutes: 0.03
    steps:
      - run: |
          {long_step(pid_file)}
      - run: echo "skipped after the timeout"
      - if: always()
        run: echo "cleanup with status ${{{{ job.status }}}}"
"""
    claimed = await executor_harness.claim(workflow)
    assert await asyncio.wait_for(executor_harness.run(claimed), 30) == 0
    assert process_gone(pid_file)
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert [s.status for s in task.steps] == ["failure", "skipped", "success"]
    assert any("has exceeded the maximum execution time of 0.03 minutes" in row for row in rows_of(task, 0))
    assert rows_of(task, 2)[-1] == "cleanup with status failure"


async def test_the_deadline_stops_everything(executor_harness: ExecutorHarness, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    workflow = f"""
on: push
jobs:
  late:
    runs-on: self-hosted
    steps:
      - run: |
          {long_step(pid_file)}
      - if: always()
        run: echo "nothing runs after the deadline"
"""
    claimed = await executor_harness.claim(workflow, deadline=datetime.now(UTC) + timedelta(seconds=2))
    assert await asyncio.wait_for(executor_harness.run(claimed), 30) == 0
    assert process_gone(pid_file)
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert [s.status for s in task.steps] == ["failure", "cancelled"]
    assert "##[error]The job reached the deadline set when it was claimed; it was stopped." in task.log_rows


async def test_a_step_handler_that_ignores_the_stop_is_cancelled_and_the_job_still_ends(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step kind that does not watch `stop` (here: a stand-in for a slow transfer) is cancelled
    after the stop graces; the step ends cancelled and the task is finalized, not lost."""
    from dynrunner.executor import steps

    entered = asyncio.Event()

    async def stubborn(run: StepRun) -> bool:
        run.log("stubborn step started")
        entered.set()
        await asyncio.sleep(600)
        return True

    monkeypatch.setitem(steps.HANDLERS, steps.ARTIFACT_IMPORT, stubborn)
    workflow = """
on: push
jobs:
  stuck:
    runs-on: self-hosted
    steps:
      - uses: dynrunner://artifact-import
      - if: always()
        run: echo "always after the stuck step"
"""
    claimed = await executor_harness.claim(workflow)
    running = asyncio.create_task(executor_harness.run(claimed))
    await asyncio.wait_for(entered.wait(), 20)
    await executor_harness.wait_for_log(claimed.task_id, "stubborn step started")
    executor_harness.gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert [s.status for s in task.steps] == ["cancelled", "success"]
    assert rows_of(task, 1)[-1] == "always after the stuck step"
