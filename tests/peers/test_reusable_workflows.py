"""Reusable workflows against real Gitea 1.24, 1.25 and 1.26.

What this proves about the releases (docs/reusable-workflows.md): a job-level `uses:` is one
job with no labels, which the controller's pool runner claims; its task has no steps; the
executor fetches the called workflows from Gitea's own git server with the task token (one of
the caller's private repository at the run's commit, one of another, public repository at a
branch), runs their jobs in that task, and the called workflow's outputs reach a later job
through Gitea's `needs`. A secret passed to the called workflow and one it inherits are
masked in the log Gitea stores. The workflows are the e2e tier's (tests/fixtures/reusable_workflows.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest

from tests.fixtures.real_controller import controller_config, controller_running
from tests.fixtures.real_gitea import RealGitea, Run
from tests.fixtures.reusable_workflows import BUILD, NOTIFY, PIPELINE_SECRETS, pipeline

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ORGS = itertools.count(1)


async def _wait(gitea: RealGitea, repo: str, within: float = 150.0) -> Run | None:
    """The push's run once it ended, followed by its number: a run Gitea made later (see
    below) is not taken for it."""
    deadline = time.monotonic() + within
    index: int | None = None
    while time.monotonic() < deadline:
        run = await asyncio.to_thread(gitea.read_run, repo, logs=False, index=index)
        if run is not None:
            index = run.index
            if run.done:
                return await asyncio.to_thread(gitea.read_run, repo, index=index)
        await asyncio.sleep(1)
    return None


async def test_local_and_remote_reusable_workflows_on_a_real_release(real_gitea: RealGitea, tmp_path: Path) -> None:
    gitea = real_gitea
    org = f"reuse{next(ORGS)}"
    await asyncio.to_thread(gitea.create_org, org)
    shared = await asyncio.to_thread(gitea.create_repo, org, "shared")
    await asyncio.to_thread(gitea.commit_file, shared, ".gitea/workflows/notify.yml", NOTIFY)
    app = await asyncio.to_thread(gitea.create_repo, org, "app", private=True)
    for name, value in PIPELINE_SECRETS.items():
        await asyncio.to_thread(gitea.set_secret, app, name, value)
    async with controller_running(controller_config(gitea.url, gitea.registration_token, tmp_path)):
        # One push: Gitea reads a push's workflows at the branch's head when it gets to it, so
        # a separate earlier push of build.yml, handled late, made a second run of ci.yml that
        # cancelled the first (1.25.5, CI).
        workflow = pipeline(f"{org}/shared/.gitea/workflows/notify.yml@main")
        files = {".gitea/workflows/build.yml": BUILD, ".gitea/workflows/ci.yml": workflow}
        await asyncio.to_thread(gitea.commit_files, app, files, "ci")
        run = await _wait(gitea, app)
    assert run is not None, f"Gitea {gitea.version}: the run did not end"
    jobs = {job.name: job for job in run.jobs}
    report = "\n\n".join(f"{j.name} {j.status} {j.steps}\n{j.log}" for j in run.jobs)
    numbers = await asyncio.to_thread(gitea.run_numbers, app)
    assert run.status == "success", f"Gitea {gitea.version}, run {run.index} of runs {numbers}:\n{report}"
    assert set(jobs) == {"build", "notify", "report"}
    assert jobs["build"].steps == [] and jobs["notify"].steps == []  # a calling job's task has no steps
    assert "building app at level 3, strip=true" in jobs["build"].log
    assert "signing with ***" in jobs["build"].log
    assert "notifying about app-3.tar with ***" in jobs["notify"].log  # an inherited secret
    assert "artifact app-3.tar, notified yes" in jobs["report"].log
    stored = "\n".join(job.log for job in run.jobs)
    assert "k3y-s3cret" not in stored and "t0ken" not in stored
