"""`uses: dynrunner://artifact-import`, the native step, between two jobs of one run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dynrunner.proto.assignment import ArtifactStoreOptions
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness

WORKFLOW = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - run: echo "built at $GITHUB_SHA" > "$KRUNTIME_ARTIFACTS_DIR/dist.txt"
  deploy:
    needs: build
    runs-on: self-hosted
    steps:
      - uses: dynrunner://artifact-import
        with:
          from: jobs.build.artifacts.dist.txt
          path: out/dist.txt
      - run: cat out/dist.txt
      - uses: dynrunner://artifact-import
        with:
          from: jobs.build.artifacts.missing.tgz
          path: missing.tgz
      - if: always()
        uses: dynrunner://artifact-import
        with:
          path: only-a-path
"""


async def test_import_between_jobs_and_clear_failures(executor_harness: ExecutorHarness, tmp_path: Path) -> None:
    store = ArtifactStoreOptions(driver="Filesystem", path=str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    build = await executor_harness.claim(WORKFLOW, artifacts=store)
    assert await executor_harness.run(build) == 0
    assert executor_harness.gitea.task(build.task_id).result == Result.SUCCESS
    deploy = await executor_harness.claim_waiting(build.run, artifacts=store)
    assert deploy.assignment.job_key == "deploy"
    assert await executor_harness.run(deploy) == 0
    task = executor_harness.gitea.task(deploy.task_id)
    assert [s.status for s in task.steps] == ["success", "success", "failure", "failure"]
    sha = (build.task.context or {})["sha"]
    assert f"built at {sha}" in task.log_rows
    assert any(row.startswith("Imported artifact 'dist.txt' of job 'build'") for row in task.log_rows)
    assert any(
        row.startswith("##[error]job 'build' did not publish an artifact named 'missing.tgz'; it published dist.txt")
        for row in task.log_rows
    )
    assert any("needs `with: from`" in row for row in task.log_rows)


CLI_ON_PATH = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - run: echo "hello" > "$KRUNTIME_ARTIFACTS_DIR/hello.txt"
  deploy:
    needs: build
    runs-on: self-hosted
    steps:
      - run: |
          dynrunner-executor artifact import jobs.build.artifacts.hello.txt got.txt
          cat got.txt
          echo "launcher at $(command -v dynrunner-executor)"
"""


async def test_steps_find_the_artifact_cli_on_path(
    executor_harness: ExecutorHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor's installation is not on the steps' PATH (as under the local backend of a
    controller started from a virtualenv); a launcher in the runtime directory still answers to
    `dynrunner-executor`, and only that name is added."""
    venv_bin = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin))
    store = ArtifactStoreOptions(driver="Filesystem", path=str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    build = await executor_harness.claim(CLI_ON_PATH, artifacts=store)
    assert await executor_harness.run(build) == 0
    deploy = await executor_harness.claim_waiting(build.run, artifacts=store)
    assert await executor_harness.run(deploy) == 0
    task = executor_harness.gitea.task(deploy.task_id)
    assert task.result == Result.SUCCESS, task.log_rows
    assert "hello" in task.log_rows
    [where] = [row for row in task.log_rows if row.startswith("launcher at ")]
    assert where.endswith("/.dynrunner/bin/dynrunner-executor")


async def test_a_cancel_stops_an_import_in_progress(
    executor_harness: ExecutorHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import step watches the stop like a process step does: a cancel ends a long transfer
    at once instead of after the stop graces (here a minute, longer than the test waits)."""
    import asyncio

    from dynrunner.executor.job import JobSettings
    from dynrunner.executor.runtime import JobRuntime
    from dynrunner.executor.steps.process import StopTimings
    from tests.fixtures.executor import fast_options

    store = ArtifactStoreOptions(driver="Filesystem", path=str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    build = await executor_harness.claim(WORKFLOW, artifacts=store)
    assert await executor_harness.run(build) == 0
    deploy = await executor_harness.claim_waiting(build.run, artifacts=store)
    transfer = {"started": asyncio.Event(), "cancelled": False}

    async def slow_import(self: JobRuntime, from_: str, path: str, log: object, **kwargs: object) -> None:
        transfer["started"].set()  # type: ignore[attr-defined]
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            transfer["cancelled"] = True
            raise

    monkeypatch.setattr(JobRuntime, "import_artifact", slow_import)
    options = fast_options()
    slow_stop = StopTimings(sigint_grace=60.0, sigterm_grace=60.0, drain_after_exit=1.0, poll=0.02)
    options = type(options)(job=JobSettings(version="test", timings=slow_stop), reporter=options.reporter)
    running = asyncio.create_task(executor_harness.run(deploy, options))
    await asyncio.wait_for(transfer["started"].wait(), 20)  # type: ignore[attr-defined]
    executor_harness.gitea.cancel_run(deploy.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    assert transfer["cancelled"]
    task = executor_harness.gitea.task(deploy.task_id)
    assert task.result == Result.CANCELLED
    assert task.steps[0].status == "cancelled"
