"""Issue 5's CI example end to end through the real executor and the Gitea double, on both drivers:
`build` shares its workspace across checkout/test/package steps, outputs `tests=passed` and publishes
`dist.tgz`; `deploy` needs it, imports it with `uses: dynrunner://artifact-import`, lists and imports
again with the CLI in a `run:` step, and succeeds. Without the artifact, `deploy` fails saying why."""

from __future__ import annotations

import dataclasses
import json
import sys

from dynrunner.executor.runtime import ARTIFACTS_OUTPUT_KEY
from dynrunner.proto.gitea import Result
from tests.fixtures.artifact_backends import Backend
from tests.fixtures.executor import Claimed, ExecutorHarness

CLI = f"{sys.executable} -m dynrunner.executor.cli artifact"

WORKFLOW = """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      tests: ${{ steps.test.outputs.tests }}
    steps:
      - name: checkout
        run: mkdir -p src && echo 'print("hello")' > src/app.py
      - id: test
        run: |
          test -f src/app.py
          echo "tests=passed" >> "$GITHUB_OUTPUT"
      - name: package
        run: |
          mkdir -p dist && cp src/app.py dist/
          PUBLISH
  deploy:
    needs: build
    if: needs.build.outputs.tests == 'passed'
    runs-on: self-hosted
    steps:
      - uses: dynrunner://artifact-import
        with:
          from: jobs.build.artifacts.dist.tgz
          path: dist.tgz
      - run: |
          CLI list
          CLI import jobs.build.artifacts.dist.tgz again/dist.tgz
          mkdir release && tar -xzf dist.tgz -C release && cat release/app.py
          cmp dist.tgz again/dist.tgz && echo "same bytes"
"""

PUBLISH = 'tar -czf "$KRUNTIME_ARTIFACTS_DIR/dist.tgz" -C dist .'


def workflow(publish: str) -> str:
    return WORKFLOW.replace("PUBLISH", publish).replace("CLI", CLI)


def with_store(claimed: Claimed, backend: Backend) -> Claimed:
    executor = dataclasses.replace(claimed.assignment.executor, artifacts=backend.options)
    return dataclasses.replace(claimed, assignment=claimed.assignment.replace(executor=executor))


async def run_both(harness: ExecutorHarness, backend: Backend, publish: str) -> tuple[int, int]:
    build = with_store(await harness.claim(workflow(publish)), backend)
    assert await harness.run(build) == 0
    deploy = with_store(await harness.claim_waiting(build.run), backend)
    assert deploy.task.needs["build"].result == Result.SUCCESS
    assert await harness.run(deploy) == 0
    return build.task_id, deploy.task_id


async def test_build_then_deploy_through_gitea(executor_harness: ExecutorHarness, backend: Backend) -> None:
    build_id, deploy_id = await run_both(executor_harness, backend, PUBLISH)
    build = executor_harness.gitea.task(build_id)
    assert build.result == Result.SUCCESS
    assert build.outputs["tests"] == "passed"
    refs = json.loads(build.outputs[ARTIFACTS_OUTPUT_KEY])["refs"]
    assert [(r["name"], r["type"], r["driver"]) for r in refs] == [("dist.tgz", "File", backend.driver)]
    assert any("Uploaded artifact 'dist.tgz' (File" in row for row in build.log_rows)

    deploy = executor_harness.gitea.task(deploy_id)
    assert deploy.result == Result.SUCCESS, "\n".join(deploy.log_rows)
    rows = deploy.log_rows
    assert any("Imported artifact 'dist.tgz' of job 'build' (File" in row and "to dist.tgz" in row for row in rows)
    listing = next(i for i, row in enumerate(rows) if row.split()[:2] == ["JOB", "NAME"])
    assert rows[listing + 1].split()[:3] == ["build", "dist.tgz", "File"]
    assert 'print("hello")' in rows and "same bytes" in rows


async def test_a_missing_artifact_fails_the_deploy_step_with_the_reason(
    executor_harness: ExecutorHarness, backend: Backend
) -> None:
    build_id, deploy_id = await run_both(executor_harness, backend, 'tar -czf "$RUNNER_TEMP/dist.tgz" -C dist .')
    assert ARTIFACTS_OUTPUT_KEY not in executor_harness.gitea.task(build_id).outputs
    deploy = executor_harness.gitea.task(deploy_id)
    assert deploy.result == Result.FAILURE
    assert deploy.steps[0].status == "failure" and deploy.steps[1].status == "skipped"
    assert "##[error]job 'build' did not publish an artifact named 'dist.tgz'; it published no artifacts" in (
        deploy.log_rows
    )
