"""`dynrunner-executor artifact list|import` run the way a `run:` step runs them: a separate process
that finds the job through the step's environment variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dynrunner.executor.runtime import JobRuntime
from dynrunner.proto.gitea.types import Need, Result
from tests.fixtures.artifact_backends import Backend


def artifact_cli(runtime: JobRuntime, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **runtime.step_files(5).env_vars()}
    return subprocess.run(
        [sys.executable, "-m", "dynrunner.executor.cli", "artifact", *args],
        env=env,
        cwd=cwd or runtime.workspace.path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def build_and_deploy(tmp_path: Path, backend: Backend) -> JobRuntime:
    build = JobRuntime.create(
        tmp_path / "build", repository="acme/app", run_id="3", job_key="build", artifacts=backend.options, needs={}
    )
    files = build.step_files(0)
    (files.artifacts_dir / "dist.tgz").write_bytes(b"tarball bytes")
    (files.artifacts_dir / "docs").mkdir()
    (files.artifacts_dir / "docs" / "index.md").write_text("# docs")
    await build.after_step_success(files, lambda line: None)
    needs = {"build": Need(outputs=build.job_outputs(), result=Result.SUCCESS)}
    return JobRuntime.create(
        tmp_path / "deploy", repository="acme/app", run_id="3", job_key="deploy", artifacts=backend.options, needs=needs
    )


async def test_list_and_import_from_a_step(tmp_path: Path, backend: Backend) -> None:
    deploy = await build_and_deploy(tmp_path, backend)
    listed = artifact_cli(deploy, "list")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["JOB", "NAME", "TYPE", "SIZE", "DIGEST"]
    assert [row[:3] for row in rows[1:]] == [["build", "dist.tgz", "File"], ["build", "docs", "Directory"]]

    as_json = artifact_cli(deploy, "list", "--json")
    assert [json.loads(line)["name"] for line in as_json.stdout.splitlines()] == ["dist.tgz", "docs"]
    assert json.loads(as_json.stdout.splitlines()[0])["job"] == "build"

    (deploy.workspace.path / "sub").mkdir()
    imported = artifact_cli(
        deploy, "import", "jobs.build.artifacts.dist.tgz", "dist.tgz", cwd=deploy.workspace.path / "sub"
    )
    assert imported.returncode == 0, imported.stderr
    assert "Imported artifact 'dist.tgz' of job 'build' (File, 13 B) to sub/dist.tgz" in imported.stdout
    assert (deploy.workspace.path / "sub" / "dist.tgz").read_bytes() == b"tarball bytes"
    assert artifact_cli(deploy, "import", "jobs.build.artifacts.docs", "docs").returncode == 0
    assert (deploy.workspace.path / "docs" / "index.md").read_text() == "# docs"


async def test_errors_go_to_stderr_with_exit_status_1(tmp_path: Path, backend: Backend) -> None:
    deploy = await build_and_deploy(tmp_path, backend)
    missing = artifact_cli(deploy, "import", "jobs.build.artifacts.nope", "x")
    assert missing.returncode == 1
    assert (
        missing.stderr == "error: job 'build' did not publish an artifact named 'nope'; it published dist.tgz, docs\n"
    )
    escape = artifact_cli(deploy, "import", "jobs.build.artifacts.dist.tgz", "../../x")
    assert (escape.returncode, escape.stderr) == (1, "error: import path '../../x' contains '..'\n")
    outside = artifact_cli(deploy, "import", "jobs.build.artifacts.dist.tgz", "x", cwd=tmp_path)
    assert outside.returncode == 1 and "is outside the workspace" in outside.stderr


def test_outside_a_job_the_cli_says_where_it_must_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DYNRUNNER_RUNTIME_DIR"}
    result = subprocess.run(
        [sys.executable, "-m", "dynrunner.executor.cli", "artifact", "list"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "DYNRUNNER_RUNTIME_DIR is not set; run this inside a step of a dynrunner job" in result.stderr
