"""Git's smart HTTP server of the double, driven by the real git client."""

from __future__ import annotations

import base64
import gzip
from pathlib import Path

import pyqwest
import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, Result, Task
from tests.fixtures.git import GitClient, checkout_header
from tests.fixtures.gitea_calls import final_state, job, register, workflow


async def _claim(gitea: GiteaDouble, repository: str) -> tuple[GiteaClient, Task]:
    gitea.submit(repository, workflow(job("build")))
    runner = await register(gitea)
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    return runner, fetched.task


def _token(task: Task) -> str:
    return str(task.context["token"])


async def _get(url: str, headers: dict[str, str] | None = None) -> pyqwest.FullResponse:
    return await pyqwest.Client().get(url, headers=headers or {})


async def test_a_public_repository_clones_anonymously_with_and_without_dot_git(
    gitea: GiteaDouble, git_client: GitClient, tmp_path: Path
) -> None:
    gitea.create_repository("acme/tools")
    first = gitea.commit("acme/tools", {"README.md": "one\n", "bin/run.sh": "#!/bin/sh\n"}, executable=["bin/run.sh"])
    second = gitea.commit("acme/tools", {"README.md": "two\n"}, tags=["v1", "v1.0.0"], message="second")
    assert gitea.repository("acme/tools").refs == {
        "refs/heads/main": second.sha,
        "refs/tags/v1": second.sha,
        "refs/tags/v1.0.0": second.sha,
    }
    for suffix, out in ((".git", "a"), ("", "b")):
        done = await git_client.run("clone", "--quiet", f"{gitea.url}/acme/tools{suffix}", str(tmp_path / out))
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "a" / "README.md").read_text() == "two\n"
    assert (tmp_path / "b" / "bin" / "run.sh").stat().st_mode & 0o111
    log = await git_client.run("log", "--format=%H %s", cwd=tmp_path / "a")
    assert log.stdout.split("\n")[:2] == [f"{second.sha} second", f"{first.sha} commit from a test"]
    tag = await git_client.run("clone", "--quiet", "--depth=1", "--branch=v1", f"{gitea.url}/acme/tools.git", "t")
    assert tag.returncode == 0, tag.stderr


async def test_a_private_repository_asks_anonymous_clients_for_credentials(
    gitea: GiteaDouble, git_client: GitClient
) -> None:
    gitea.create_repository("acme/secret", private=True)
    gitea.commit("acme/secret", {"a": "1"})
    response = await _get(f"{gitea.url}/acme/secret.git/info/refs?service=git-upload-pack")
    assert response.status == 401
    assert response.headers["www-authenticate"] == 'Basic realm="Gitea"'
    done = await git_client.run("clone", f"{gitea.url}/acme/secret.git", "out")
    assert done.returncode != 0 and "could not read Username" in done.stderr


async def test_a_running_task_token_reads_its_own_private_repository_the_way_checkout_sends_it(
    gitea: GiteaDouble, git_client: GitClient, tmp_path: Path
) -> None:
    """`actions/checkout` sets `http.<server>.extraheader: AUTHORIZATION: basic
    base64(x-access-token:<token>)` and fetches the run's commit by sha, depth 1."""
    gitea.create_repository("acme/app", private=True)
    commit = gitea.commit("acme/app", {"src/main.py": "print('hi')\n"})
    _, task = await _claim(gitea, "acme/app")
    assert task.context["sha"] == commit.sha  # a run's commit is the head of its ref
    work = tmp_path / "work"
    work.mkdir()
    for args in (
        ("init", "--quiet", "."),
        ("remote", "add", "origin", f"{gitea.url}/acme/app"),
        (
            "-c",
            "protocol.version=2",
            "fetch",
            "--no-tags",
            "--depth=1",
            "origin",
            f"+{commit.sha}:refs/remotes/origin/main",
        ),
        ("checkout", "--quiet", "--force", "-B", "main", "refs/remotes/origin/main"),
    ):
        done = await git_client.run(*args, cwd=work, extra_header=checkout_header(_token(task)))
        assert done.returncode == 0, (args, done.stderr)
    assert (work / "src" / "main.py").read_text() == "print('hi')\n"


@pytest.mark.parametrize("form", ["basic-user-as-token", "basic-in-url", "token-scheme", "runtime-jwt"])
async def test_every_form_gitea_accepts_for_a_task_credential(
    gitea: GiteaDouble, git_client: GitClient, tmp_path: Path, form: str
) -> None:
    gitea.create_repository("acme/app", private=True)
    gitea.commit("acme/app", {"a": "1"})
    _, task = await _claim(gitea, "acme/app")
    token, url, header = _token(task), f"{gitea.url}/acme/app.git", None
    if form == "basic-user-as-token":
        header = "Authorization: Basic " + base64.b64encode(f"{token}:x-oauth-basic".encode()).decode()
    elif form == "basic-in-url":
        url = url.replace("http://", f"http://gitea-actions:{token}@")
    elif form == "token-scheme":
        header = f"Authorization: token {token}"
    else:
        header = f"Authorization: Bearer {task.context['gitea_runtime_token']}"
    done = await git_client.run("clone", "--quiet", url, str(tmp_path / "out"), extra_header=header)
    assert done.returncode == 0, done.stderr


async def test_a_task_token_does_not_read_another_private_repository(gitea: GiteaDouble) -> None:
    gitea.create_repository("acme/app", private=True)
    gitea.create_repository("other/private", private=True)
    gitea.create_repository("other/public")
    _, task = await _claim(gitea, "acme/app")
    header = {"authorization": checkout_header(_token(task)).split(": ", 1)[1]}
    denied = await _get(f"{gitea.url}/other/private.git/info/refs?service=git-upload-pack", header)
    assert (denied.status, denied.content) == (404, b"Repository not found")
    public = await _get(f"{gitea.url}/other/public.git/info/refs?service=git-upload-pack", header)
    assert public.status == 200
    missing = await _get(f"{gitea.url}/acme/nothing.git/info/refs?service=git-upload-pack", header)
    assert missing.status == 404


async def test_a_finished_task_token_or_a_wrong_one_is_refused_even_for_public_repositories(
    gitea: GiteaDouble,
) -> None:
    gitea.create_repository("acme/app")
    runner, task = await _claim(gitea, "acme/app")
    url = f"{gitea.url}/acme/app.git/info/refs?service=git-upload-pack"
    header = {"authorization": checkout_header(_token(task)).split(": ", 1)[1]}
    assert (await _get(url, header)).status == 200
    await runner.update_task(final_state(task.id, Result.SUCCESS), {})
    refused = await _get(url, header)
    assert (refused.status, refused.content) == (401, b"Failed to authenticate user\n")
    wrong = await _get(url, {"authorization": "Bearer " + "0" * 40})
    assert wrong.status == 401
    assert (await _get(url)).status == 200


async def test_the_advertisement_and_the_rpc_follow_the_smart_http_wire(gitea: GiteaDouble) -> None:
    gitea.create_repository("acme/app")
    commit = gitea.commit("acme/app", {"a": "1"})
    refs = await _get(f"{gitea.url}/acme/app/info/refs?service=git-upload-pack")
    assert refs.status == 200
    assert refs.headers["content-type"] == "application/x-git-upload-pack-advertisement"
    assert refs.headers["cache-control"] == "no-cache, max-age=0, must-revalidate"
    assert refs.content.startswith(b"001e# service=git-upload-pack\n0000")
    assert f"{commit.sha} refs/heads/main".encode() in refs.content
    bad_service = await _get(f"{gitea.url}/acme/app/info/refs?service=git-frobnicate")
    assert bad_service.status == 400
    want = f"0032want {commit.sha}\n00000009done\n".encode()
    client = pyqwest.Client()
    for encoding, body in (("identity", want), ("gzip", gzip.compress(want))):
        pack = await client.post(
            f"{gitea.url}/acme/app.git/git-upload-pack",
            headers={"content-type": "application/x-git-upload-pack-request", "content-encoding": encoding},
            content=body,
        )
        assert pack.status == 200 and pack.headers["content-type"] == "application/x-git-upload-pack-result"
        assert b"PACK" in pack.content, encoding
    wrong_type = await client.post(
        f"{gitea.url}/acme/app.git/git-upload-pack", headers={"content-type": "text/plain"}, content=want
    )
    assert wrong_type.status == 400


async def test_pushes_are_refused(gitea: GiteaDouble, git_client: GitClient, tmp_path: Path) -> None:
    gitea.create_repository("acme/app")
    gitea.commit("acme/app", {"a": "1"})
    _, task = await _claim(gitea, "acme/app")
    url = f"{gitea.url}/acme/app.git/info/refs?service=git-receive-pack"
    assert (await _get(url)).status == 401
    header = {"authorization": checkout_header(_token(task)).split(": ", 1)[1]}
    assert (await _get(url, header)).status == 403


def test_repositories_are_created_once_and_commits_check_their_input(gitea: GiteaDouble) -> None:
    gitea.create_repository("acme/app")
    with pytest.raises(ValueError, match="already exists"):
        gitea.create_repository("ACME/App")
    with pytest.raises(ValueError, match="invalid file path"):
        gitea.commit("acme/app", {"../escape": "x"})
    with pytest.raises(ValueError, match="invalid tag name"):
        gitea.commit("acme/app", {"a": "x"}, tags=["bad..name"])
    with pytest.raises(KeyError):
        gitea.commit("acme/none", {"a": "x"})
    replaced = gitea.commit("acme/app", {"b": b"\x00\x01"}, replace=True, branch="feature")
    assert gitea.repository("acme/app").refs["refs/heads/feature"] == replaced.sha


async def test_the_runtime_token_stops_working_when_it_expires(gitea: GiteaDouble) -> None:
    """`exp` = issue time + 1 h + the 3 h endless-task timeout (Gitea ≥ 1.25; 24 h in 1.24)."""
    gitea.create_repository("acme/app", private=True)
    _, task = await _claim(gitea, "acme/app")
    url = f"{gitea.url}/acme/app.git/info/refs?service=git-upload-pack"
    header = {"authorization": f"Bearer {task.context['gitea_runtime_token']}"}
    assert (await _get(url, header)).status == 200
    gitea.advance_clock(4 * 3600)
    assert (await _get(url, header)).status == 401
