"""Reusable workflows against real Gitea 1.24, 1.25 and 1.26.

What this proves about the releases (docs/reusable-workflows.md): a job-level `uses:` is one
job with no labels, which the controller's pool runner claims; its task has no steps; the
executor fetches the called workflows from Gitea's own git server with the task token (one of
the caller's private repository at the run's commit, one of another, public repository at a
branch), runs their jobs in that task, and the called workflow's outputs reach a later job
through Gitea's `needs`. A secret passed to the called workflow is masked in the log Gitea
stores.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest

from tests.fixtures.real_controller import controller_config, controller_running
from tests.fixtures.real_gitea import RealGitea, Run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ORGS = itertools.count(1)

BUILD = """
on:
  workflow_call:
    inputs:
      target:
        type: string
        required: true
      level:
        type: number
        default: 1
    secrets:
      key:
        required: true
    outputs:
      artifact:
        value: ${{ jobs.build.outputs.name }}
jobs:
  build:
    runs-on: [self-hosted, local]
    outputs:
      name: ${{ steps.b.outputs.name }}
    steps:
      - id: b
        run: |
          echo "building ${{ inputs.target }} at level ${{ inputs.level }} with ${{ secrets.key }}"
          echo "name=${{ inputs.target }}-${{ inputs.level }}.tar" >> "$GITHUB_OUTPUT"
"""

NOTIFY = """
on:
  workflow_call:
    inputs:
      what:
        type: string
jobs:
  send:
    runs-on: [self-hosted, local]
    steps:
      - run: echo "notifying about ${{ inputs.what }}"
"""

PIPELINE = """
on: push
jobs:
  build:
    uses: ./.gitea/workflows/build.yml
    with:
      target: app
      level: 3
    secrets:
      key: ${{ secrets.SIGNING_KEY }}
  notify:
    needs: build
    uses: {org}/shared/.gitea/workflows/notify.yml@main
    with:
      what: ${{ needs.build.outputs.artifact }}
  report:
    needs: [build, notify]
    runs-on: [self-hosted, local]
    steps:
      - run: echo "artifact ${{ needs.build.outputs.artifact }}"
"""


async def _wait(gitea: RealGitea, repo: str, within: float = 150.0) -> Run | None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        run = await asyncio.to_thread(gitea.read_run, repo, logs=False)
        if run is not None and run.done:
            return await asyncio.to_thread(gitea.read_run, repo)
        await asyncio.sleep(1)
    return None


async def test_local_and_remote_reusable_workflows_on_a_real_release(real_gitea: RealGitea, tmp_path: Path) -> None:
    gitea = real_gitea
    org = f"reuse{next(ORGS)}"
    await asyncio.to_thread(gitea.create_org, org)
    shared = await asyncio.to_thread(gitea.create_repo, org, "shared")
    await asyncio.to_thread(gitea.commit_file, shared, ".gitea/workflows/notify.yml", NOTIFY)
    app = await asyncio.to_thread(gitea.create_repo, org, "app", private=True)
    await asyncio.to_thread(gitea.set_secret, app, "SIGNING_KEY", "k3y-s3cret")
    await asyncio.to_thread(gitea.commit_file, app, ".gitea/workflows/build.yml", BUILD)
    async with controller_running(controller_config(gitea.url, gitea.registration_token, tmp_path)):
        await asyncio.to_thread(gitea.commit_file, app, ".gitea/workflows/ci.yml", PIPELINE.replace("{org}", org))
        run = await _wait(gitea, app)
    assert run is not None, f"Gitea {gitea.version}: the run did not end"
    jobs = {job.name: job for job in run.jobs}
    report = "\n\n".join(f"{j.name} {j.status} {j.steps}\n{j.log}" for j in run.jobs)
    assert run.status == "success", f"Gitea {gitea.version}:\n{report}"
    assert set(jobs) == {"build", "notify", "report"}
    assert jobs["build"].steps == [] and jobs["notify"].steps == []  # a calling job's task has no steps
    assert "building app at level 3 with ***" in jobs["build"].log
    assert "k3y-s3cret" not in jobs["build"].log
    assert "notifying about app-3.tar" in jobs["notify"].log
    assert "artifact app-3.tar" in jobs["report"].log
