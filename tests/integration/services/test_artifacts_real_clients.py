"""Gitea's artifact endpoints in the double, driven by the real `@actions/artifact` clients
from `run:` steps of jobs the real executor runs: so the step environment (ACTIONS_RUNTIME_URL,
ACTIONS_RESULTS_URL, ACTIONS_RUNTIME_TOKEN, GITHUB_RUN_ID) and both protocols are proven
against the libraries upload-artifact@v3 and @v4 are built on."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.clients import ActionClients
from tests.fixtures.executor import ExecutorHarness

TWO_JOBS = """
on: push
jobs:
  up:
    runs-on: self-hosted
    steps:
      - run: |
          mkdir -p out/sub
          printf 'hello artifact\\n' > out/a.txt
          head -c 1500000 /dev/urandom > out/sub/big.bin
          sha256sum out/sub/big.bin | cut -c1-64 > big.sha
          node {clients}/artifact.cjs {version} upload bundle out a.txt sub/big.bin {patched}
  down:
    needs: up
    runs-on: self-hosted
    steps:
      - run: |
          node {clients}/artifact.cjs {version} download bundle got {patched}
          cat got/a.txt
          echo "sha=$(sha256sum got/sub/big.bin | cut -c1-64)"
"""


def _read_sha(workspace: Path) -> str:
    return next(workspace.rglob("big.sha")).read_text().strip()


@pytest.mark.parametrize("version", ["v4", "v3"])
async def test_an_artifact_uploaded_by_one_job_is_downloaded_by_the_next(
    executor_harness: ExecutorHarness, gitea: GiteaDouble, action_clients: ActionClients, version: str
) -> None:
    workflow = TWO_JOBS.format(clients=action_clients.root, version=version, patched="--patched")
    up = await executor_harness.claim(workflow, job_key="up")
    assert await executor_harness.run(up) == 0
    up_task = gitea.task(up.task_id)
    assert up_task.status == "success", "\n".join(up_task.log_rows)
    stored = gitea.artifacts(up.run.id)
    assert {a.status for a in stored} == {"upload_confirmed"}
    if version == "v4":
        assert [(a.name, a.path, a.content_encoding) for a in stored] == [("bundle", "bundle.zip", "application/zip")]
    else:
        assert sorted(a.path for a in stored) == ["a.txt", "sub/big.bin"]
    expected_sha = _read_sha(Path(up.assignment.executor.workspace))

    down = await executor_harness.claim_waiting(None, job_key="down")
    assert await executor_harness.run(down) == 0
    down_task = gitea.task(down.task_id)
    assert down_task.status == "success", "\n".join(down_task.log_rows)
    assert "hello artifact" in down_task.log_rows
    assert f"sha={expected_sha}" in down_task.log_rows


async def test_the_v4_client_refuses_gitea_unless_its_host_test_is_patched(
    executor_harness: ExecutorHarness, gitea: GiteaDouble, action_clients: ActionClients
) -> None:
    """What users of the stock upload-artifact@v4 see on Gitea (and why act_runner edits the
    bundle): the client's isGhes() takes the Gitea URL for GitHub Enterprise and refuses."""
    workflow = TWO_JOBS.format(clients=action_clients.root, version="v4", patched="")
    up = await executor_harness.claim(workflow, job_key="up")
    assert await executor_harness.run(up) == 0
    task = gitea.task(up.task_id)
    assert task.status == "failure"
    assert any("not currently supported on GHES" in row for row in task.log_rows)
    assert gitea.artifacts(up.run.id) == []
