"""The job-local workspace layout and per-step files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dynrunner.executor.runtime import JobRuntime, RepositoryError, Workspace
from dynrunner.executor.runtime.repository import Repository
from dynrunner.proto.assignment import ArtifactStoreOptions


def runtime(tmp_path: Path, repository: str = "Acme/Widgets") -> JobRuntime:
    return JobRuntime.create(
        tmp_path / "ws", repository=repository, run_id="12", job_key="build", artifacts=ArtifactStoreOptions(), needs={}
    )


def test_layout_keeps_runtime_files_beside_the_shared_workspace(tmp_path: Path) -> None:
    ws = runtime(tmp_path).workspace
    root = (tmp_path / "ws").resolve()
    assert ws.root == root
    assert ws.path == root / "workspace" / "Acme" / "Widgets"
    assert ws.runtime_dir == root / ".dynrunner"
    assert ws.temp_dir == root / "temp"
    assert ws.tool_cache == root / "tool-cache"
    for directory in (ws.path, ws.runtime_dir, ws.temp_dir, ws.tool_cache):
        assert directory.is_dir()
    assert stat.S_IMODE(ws.runtime_dir.stat().st_mode) == 0o700
    assert not ws.path.is_relative_to(ws.runtime_dir) and not ws.runtime_dir.is_relative_to(ws.path)
    assert os.listdir(ws.path) == []


def test_job_state_is_private_to_the_runtime(tmp_path: Path) -> None:
    ws = runtime(tmp_path).workspace
    state = ws.runtime_dir / "job.json"
    assert state.is_file()
    assert stat.S_IMODE(state.stat().st_mode) == 0o600


def test_step_files_are_fresh_and_empty(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    files = rt.step_files(3)
    assert files.directory == rt.workspace.runtime_dir / "steps" / "3"
    for path in (files.output, files.env, files.path, files.state, files.summary):
        assert path.read_bytes() == b""
    assert files.script_dir.is_dir() and files.artifacts_dir.is_dir()
    files.output.write_text("x=1\n")
    (files.artifacts_dir / "leftover").write_text("old")
    (files.script_dir / "run.sh").write_text("echo")
    again = rt.step_files(3)
    assert again.output.read_bytes() == b""
    assert os.listdir(again.artifacts_dir) == [] and os.listdir(again.script_dir) == []


def test_attempts_get_their_own_directory(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    main, post = rt.step_files(1), rt.step_files(1, "post")
    assert main.directory.name == "1" and post.directory.name == "1-post"
    assert main.key != post.key
    with pytest.raises(ValueError, match="attempt"):
        rt.step_files(1, "../x")
    with pytest.raises(ValueError, match="negative"):
        rt.step_files(-1)


def test_env_vars_point_every_name_at_the_step_files(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    files = rt.step_files(0)
    env = files.env_vars()
    assert env["GITHUB_OUTPUT"] == env["GITEA_OUTPUT"] == env["KRUNTIME_OUTPUTS"] == str(files.output)
    assert env["GITHUB_ENV"] == env["GITEA_ENV"] == str(files.env)
    assert env["GITHUB_PATH"] == env["GITEA_PATH"] == str(files.path)
    assert env["GITHUB_STATE"] == str(files.state)
    assert env["GITHUB_STEP_SUMMARY"] == str(files.summary)
    assert env["KRUNTIME_ARTIFACTS_DIR"] == str(files.artifacts_dir)
    assert env["DYNRUNNER_RUNTIME_DIR"] == str(rt.workspace.runtime_dir)


def test_a_second_runtime_on_the_same_root_reuses_the_workspace(tmp_path: Path) -> None:
    first = runtime(tmp_path)
    (first.workspace.path / "shared.txt").write_text("kept")
    second = runtime(tmp_path)
    assert (second.workspace.path / "shared.txt").read_text() == "kept"


@pytest.mark.parametrize(
    "bad", ["noslash", "a/b/c", "../x", "a/..", "./b", "o/r r", "", "/repo", "owner/", "owner/repo\n"]
)
def test_unusable_repository_names_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(RepositoryError, match="is not of the form 'owner/name'"):
        runtime(tmp_path, bad)


def test_run_ids_must_be_plain(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="run id"):
        JobRuntime.create(
            tmp_path, repository="a/b", run_id="../1", job_key="j", artifacts=ArtifactStoreOptions(), needs={}
        )
    with pytest.raises(RepositoryError, match="run id"):
        JobRuntime.create(
            tmp_path, repository="a/b", run_id="1\n", job_key="j", artifacts=ArtifactStoreOptions(), needs={}
        )


def test_the_artifact_scope_is_lowercased() -> None:
    assert Repository.parse("Acme/Widgets").scope == "acme/widgets"
    assert str(Repository.parse("Acme/Widgets")) == "Acme/Widgets"


def test_workspace_at_does_not_touch_the_disk(tmp_path: Path) -> None:
    ws = Workspace.at(tmp_path / "nothing", Repository.parse("a/b"))
    assert not ws.root.exists()
