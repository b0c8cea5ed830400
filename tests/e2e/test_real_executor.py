"""End to end with the real `dynrunner-executor`: Gitea double, real nats-server, the local
backend, the controller in this process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest

from dynrunner.controller.backends.local.layout import Layout
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import (
    assert_only_armed_runners,
    in_process,
    real_executor_config,
    wait_for,
    wait_run_done,
)

MULTI_JOB = """
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    outputs:
      artifact: ${{ steps.pack.outputs.name }}
    steps:
      - id: pack
        run: |
          echo "packing"
          echo "name=app-${{ github.sha }}.tar" >> "$GITHUB_OUTPUT"
  test:
    needs: build
    runs-on: [self-hosted, local]
    strategy:
      matrix:
        shard: [1, 2]
    steps:
      - run: echo "shard ${{ matrix.shard }} tests ${{ needs.build.outputs.artifact }}"
  publish:
    needs: [build, test]
    runs-on: [self-hosted, local]
    steps:
      - run: echo "publishing ${{ needs.build.outputs.artifact }} after ${{ needs.test.result }} tests"
"""


async def test_a_multi_job_run_with_needs_outputs_and_a_matrix(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state")
    async with in_process(cfg) as running:
        run = gitea.submit("acme/app", MULTI_JOB, sha="c0ffee" + "0" * 34)
        done = await wait_run_done(gitea, run.id)
        logs = {job.name: "\n".join(gitea.task(job.task_id).log_rows) for job in done.jobs}
        assert done.status == "success", logs
        assert sorted(logs) == ["build", "publish", "test (1)", "test (2)"]
        artifact = "app-c0ffee" + "0" * 34 + ".tar"
        assert f"shard 1 tests {artifact}" in logs["test (1)"]
        assert f"shard 2 tests {artifact}" in logs["test (2)"]
        assert f"publishing {artifact} after success tests" in logs["publish"]
        for text in logs.values():
            # The controller's stage lines come first, then the executor's own rows.
            lines = text.splitlines()
            assert lines[0].startswith("[dynrunner] claimed by pool local as runner dynrunner-local-")
            assert lines[1].startswith("[dynrunner] environment dr-")
            assert "dynrunner executor" in lines[2]
        root = cfg.pools[0].backend.root_dir
        assert root is not None
        await wait_for(lambda: not any(root.iterdir()), what="every environment reaped")
        # The reaper releases a permit once deleting returned, an await after the directory went.
        capacity = running.controller.pools["local"].capacity
        await wait_for(lambda: capacity.in_use == 0, within=5, what="every permit released")
        assert running.controller.metrics.sample("dynrunner_job_results_total", pool="local", result="reported") == 4
        # Each executor signalled when it took over its task: launched → executor-ready per job.
        metrics = running.controller.metrics
        assert metrics.sample("dynrunner_launched_to_executor_ready_seconds_count", pool="local") == 4
    assert_only_armed_runners(gitea)


THREE_STEPS = """
on: push
jobs:
  three:
    runs-on: [self-hosted, local]
    steps:
      - run: echo "first"
      - run: |
          echo "working"
          sleep 120
      - run: echo "third"
"""


async def test_an_executor_killed_mid_job_is_reported_with_the_reason(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    """Also each step's final state (issue 10 item 6): the finished step stays as the executor
    reported it, the one it was running is cancelled, the one it never reached skipped (left
    out of the final report, Gitea showed the first two as running)."""
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state")
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    async with in_process(cfg):
        run = gitea.submit("acme/app", THREE_STEPS)
        job = await wait_for(lambda: (j := gitea.jobs(run.id)[0]).task_id and j, what="claim")
        await wait_for(lambda: any(r == "working" for r in gitea.task(job.task_id).log_rows), what="the step ran")
        [env_dir] = list(root.iterdir())
        layout = Layout(env_dir)
        await wait_for(lambda: second_step_reported(layout), what="the second step's start accepted by Gitea")
        wrapper = layout.read_int(layout.pid_file)
        assert wrapper is not None
        executor = executor_pid(wrapper)
        os.kill(executor, signal.SIGKILL)  # as the OOM killer would
        done = await wait_run_done(gitea, run.id)
        assert done.status == "failure"
        task = gitea.task(job.task_id)
        text = "\n".join(task.log_rows)
        assert "the job failed: the executor was killed by SIGKILL (out of memory, or stopped by an operator)" in text
        assert "[killed]" in text
        first, second, third = task.steps
        assert (first.status, second.status, third.status) == ("success", "cancelled", "skipped"), task.steps
        assert task.log_rows[first.log_index : first.log_index + first.log_length][-1] == "first"
        assert second.log_index == first.log_index + first.log_length and second.log_length > 0
        assert "working" in task.log_rows[second.log_index : second.log_index + second.log_length]
        assert 0 < second.started <= second.stopped and third.started == 0
        # The step's own processes (another session) were stopped with the environment.
        await wait_for(lambda: not any(root.iterdir()), what="environment deleted")
        await wait_for(lambda: not sleeping(env_dir), what="the step's sleep stopped")


def second_step_reported(layout: Layout) -> bool:
    state = layout.reported()
    return state is not None and len(state.steps) > 1 and state.steps[1].started_at is not None


HELD = """
on: push
jobs:
  held:
    runs-on: [self-hosted, local]
    steps:
      - run: |
          echo "holding"
          for _ in $(seq 600); do [ -e go ] && break; sleep 0.05; done
          echo "released"
"""


async def test_a_wrapper_killed_alone_leaves_the_job_to_finish(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynrunner.controller")
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state")
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    async with in_process(cfg) as running:
        run = gitea.submit("acme/app", HELD)
        job = await wait_for(lambda: (j := gitea.jobs(run.id)[0]).task_id and j, what="claim")
        await wait_for(lambda: "holding" in gitea.task(job.task_id).log_rows, what="the step ran")
        [env_dir] = list(root.iterdir())
        layout = Layout(env_dir)
        wrapper = layout.read_int(layout.pid_file)
        assert wrapper is not None
        os.kill(wrapper, signal.SIGKILL)  # the wrapper alone: an operator's or a step's stray kill
        await asyncio.sleep(1.5)  # a reaper sweep or more: it must not take the job for dead
        assert gitea.run(run.id).status == "running"
        [workspace] = [p for p in (env_dir / "workspace").rglob("app") if p.is_dir()]
        (workspace / "go").touch()
        done = await wait_run_done(gitea, run.id)
        text = "\n".join(gitea.task(job.task_id).log_rows)
        assert done.status == "success", text
        assert "released" in text and "[dynrunner] the job failed" not in text
        await wait_for(lambda: not any(root.iterdir()), what="environment deleted")
        assert running.controller.metrics.sample("dynrunner_job_results_total", pool="local", result="reported") == 1
    # Its environment ended without an exit status, but the executor's accepted state says it
    # finalized: nothing is sent, nothing claims the task failed (issue 10 item 10).
    assert "but its executor had finalized the task (success)" in caplog.text
    assert "finalized as failed" not in caplog.text and "not finalized" not in caplog.text


def executor_pid(wrapper: int) -> int:
    children = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def sleeping(env_dir: Path) -> bool:
    marker = f"RUNNER_TRACKING_ID=dynrunner_{env_dir.name}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes():
                    return True
            except OSError:
                continue
    return False
