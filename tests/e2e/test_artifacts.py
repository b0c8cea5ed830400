"""Issue 5's CI example through the whole product: the Gitea double, the controller with the
local backend and a Filesystem artifact store, real nats-server, the real executor.

`build` shares one workspace across checkout/test/package steps, outputs `tests=passed` and
writes `dist.tgz` to `$KRUNTIME_ARTIFACTS_DIR`; `deploy` needs it, imports `dist.tgz`, lists it
with the CLI a step finds on its PATH, and succeeds. When `build` publishes nothing, `deploy`
fails deterministically, naming the job, the artifact and what exists. A job of another
repository cannot reach the artifact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import in_process, real_executor_config, wait_run_done

BUILD_AND_DEPLOY = """
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    outputs:
      tests: ${{ steps.test.outputs.tests }}
    steps:
      - name: checkout
        run: mkdir -p src && echo 'print("hello from dist")' > src/app.py
      - id: test
        name: test
        run: |
          test -f src/app.py
          echo "tests=passed" >> "$GITHUB_OUTPUT"
      - name: package
        run: |
          mkdir -p dist && cp src/app.py dist/
          PUBLISH
  deploy:
    needs: build
    runs-on: [self-hosted, local]
    steps:
      - uses: dynrunner://artifact-import
        with:
          from: jobs.build.artifacts.dist.tgz
          path: dist.tgz
      - run: |
          dynrunner-executor artifact list
          mkdir release && tar -xzf dist.tgz -C release && python3 release/app.py
          echo "deploying after tests ${{ needs.build.outputs.tests }}"
"""

STEAL = """
on: push
jobs:
  steal:
    runs-on: [self-hosted, local]
    steps:
      - run: dynrunner-executor artifact import "$REF" stolen.tgz
        env:
          REF: jobs.build.artifacts.dist.tgz
"""


def _config(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> ControllerConfig:
    (tmp_path / "artifact-store").mkdir()
    store = {"driver": "Filesystem", "path": str(tmp_path / "artifact-store")}
    return real_executor_config(gitea, nats_url, tmp_path / "state", artifacts=store)


def _found(root: Path, name: str) -> list[Path]:
    return list(root.rglob(name))


def _logs(gitea: GiteaDouble, run: Any) -> dict[str, str]:
    return {job.name: "\n".join(gitea.task(job.task_id).log_rows) for job in run.jobs if job.task_id}


async def test_build_publishes_and_deploy_imports(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    workflow = BUILD_AND_DEPLOY.replace("PUBLISH", 'tar -czf "$KRUNTIME_ARTIFACTS_DIR/dist.tgz" -C dist .')
    async with in_process(_config(gitea, nats_url, tmp_path)):
        run = await wait_run_done(gitea, gitea.submit("acme/app", workflow).id)
        logs = _logs(gitea, run)
        assert run.status == "success", logs
        build = next(job for job in run.jobs if job.job_id == "build")
        outputs = gitea.task(build.task_id).outputs
        assert outputs["tests"] == "passed"
        [ref] = json.loads(outputs["dynrunner_artifacts"])["refs"]
        assert (ref["name"], ref["type"], ref["driver"]) == ("dist.tgz", "File", "Filesystem")
        assert ref["location"].startswith("acme/app/")
        assert "dist.tgz" in logs["deploy"]
        assert "hello from dist" in logs["deploy"]
        assert "deploying after tests passed" in logs["deploy"]
        # The bytes went to the store, never through Gitea: no row or output carries the archive.
        stored = tmp_path / "artifact-store" / ref["location"]
        assert stored.is_file() and stored.stat().st_size == ref["size"]

        # Another repository's job names the same ref: refused, nothing written.
        other = await wait_run_done(gitea, gitea.submit("mallory/app", STEAL).id)
        assert other.status == "failure"
        [steal] = _logs(gitea, other).values()
        assert "job 'build' is not a direct need of this job" in steal
        assert not _found(tmp_path, "stolen.tgz")


async def test_a_missing_artifact_fails_deploy_deterministically(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    workflow = BUILD_AND_DEPLOY.replace("PUBLISH", "echo 'forgot to publish'")
    async with in_process(_config(gitea, nats_url, tmp_path)):
        run = await wait_run_done(gitea, gitea.submit("acme/app", workflow).id)
        logs = _logs(gitea, run)
        statuses = {job.job_id: job.status for job in run.jobs}
        assert statuses == {"build": "success", "deploy": "failure"}, logs
        assert "dist.tgz" in logs["deploy"] and "build" in logs["deploy"]
        assert "hello from dist" not in logs["deploy"]
