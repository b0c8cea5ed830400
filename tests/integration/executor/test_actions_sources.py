"""Where actions come from: another git host (which never sees the task token), a commit SHA a
server will not hand out alone, the image's seeded actions cache, and the Node the executor
finds (`DYNRUNNER_NODE`)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from dynrunner.doubles.githost import GitHost
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness, rows_of

ECHO = """
inputs:
  text:
    default: ${{ github.token }}
runs:
  using: composite
  steps:
    - shell: sh
      run: echo "from the other host, token input ${{ inputs.text }}"
"""

NODE12 = {"action.yml": "runs:\n  using: node12\n  main: index.js\n", "index.js": "console.log('old node');\n"}


async def test_another_host_never_receives_the_task_token(
    self_hosted_actions: ExecutorHarness, git_host: GitHost
) -> None:
    """`uses: http://other-host/...` and `owner/repo@ref` resolved to github.com are not Gitea:
    the fetch carries no Authorization header (a SHA the host does not hand out alone is
    fetched through its branches and tags)."""
    first = git_host.commit("acme/echo", {"action.yml": ECHO}, tags=["v1"]).sha
    git_host.commit("acme/echo", {"action.yml": ECHO.replace("other host", "other host, later")})
    workflow = f"""
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - uses: {git_host.url}/acme/echo@v1
      - uses: {git_host.url}/acme/echo@{first}
"""
    task = await self_hosted_actions.run_job(workflow)
    assert task.result == Result.SUCCESS, task.log_rows
    assert rows_of(task, 0)[-1] == "from the other host, token input ***"
    assert rows_of(task, 1)[-1] == "from the other host, token input ***"
    seen = git_host.request_headers
    assert len(seen) >= 4  # two fetches: refs and pack each (and more for the SHA)
    assert not any("authorization" in headers for headers in seen), seen


@pytest.mark.parametrize("trick", ["{gitea}@{host}", "{gitea}#@{host}", "{gitea}?@{host}", "{other}#@{gitea_host}"])
async def test_a_uses_url_that_hides_another_host_gives_it_no_token(
    executor_harness: ExecutorHarness, git_host: GitHost, trick: str
) -> None:
    """URLs written to look like Gitea's while naming another host (user info, a fragment or a
    query before an `@`), or the other way round: the host that receives the fetch is never
    sent the task token in any form."""
    git_host.commit("acme/echo", {"action.yml": ECHO}, tags=["v1"])
    gitea = executor_harness.gitea.url
    where = trick.format(
        gitea=gitea, host=git_host.url.split("://", 1)[1], other=git_host.url, gitea_host=gitea.split("://", 1)[1]
    )
    workflow = f"on: push\njobs:\n  b:\n    runs-on: self-hosted\n    steps:\n      - uses: {where}/acme/echo@v1\n"
    claimed = await executor_harness.claim(workflow)
    await executor_harness.run(claimed)
    token = str(claimed.task.context_get("token"))
    forms = (token, base64.b64encode(f"x-access-token:{token}".encode()).decode())
    sent = [value for headers in git_host.request_headers for value in headers.values()]
    assert not any(form in value for form in forms for value in sent), sent
    if trick == "{gitea}@{host}":
        assert sent  # the fetch did go to the other host (as user "127.0.0.1")


async def test_the_seeded_actions_cache_is_used_in_place(
    executor_harness: ExecutorHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`owner/repo@ref` from github.com (the default) found under DYNRUNNER_ACTIONS_CACHE: nothing
    is fetched (this machine cannot reach github.com)."""
    cache = tmp_path / "actions-cache"
    action = cache / "github.com" / "actions" / "hello" / "release" / "v2"
    action.mkdir(parents=True)
    (action / "action.yml").write_text(
        "runs:\n  using: composite\n  steps:\n    - shell: sh\n      run: echo seeded at $GITHUB_ACTION_PATH\n"
    )
    monkeypatch.setenv("DYNRUNNER_ACTIONS_CACHE", str(cache))
    workflow = "on: push\njobs:\n  b:\n    runs-on: self-hosted\n    steps:\n      - uses: actions/hello@release/v2\n"
    task = await executor_harness.run_job(workflow)
    assert task.result == Result.SUCCESS, task.log_rows
    assert f"Using action repository 'actions/hello@release/v2' from the actions cache ({action})" in task.log_rows
    assert rows_of(task, 0)[-1] == f"seeded at {action}"


async def test_node12_actions_run_on_the_available_node_with_a_warning(self_hosted_actions: ExecutorHarness) -> None:
    workflow = "on: push\njobs:\n  b:\n    runs-on: self-hosted\n    steps:\n      - uses: acme/old@v1\n"
    self_hosted_actions.gitea.create_repository("acme/old")
    self_hosted_actions.gitea.commit("acme/old", NODE12, tags=["v1"])
    task = await self_hosted_actions.run_job(workflow)
    assert task.result == Result.SUCCESS, task.log_rows
    rows = rows_of(task, 0)
    warnings = [row for row in rows if row.startswith("##[warning]")]
    assert len(warnings) == 1
    assert warnings[0].startswith("##[warning]This action runs on node12, which is no longer supported; it runs on")
    assert rows[-1] == "old node"


async def test_without_node_a_javascript_action_fails_saying_what_the_image_needs(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DYNRUNNER_NODE", str(tmp_path / "no-node-here"))
    workflow = "on: push\njobs:\n  b:\n    runs-on: self-hosted\n    steps:\n      - uses: ./js\n"
    task = await executor_harness.run_job(workflow, files={f"js/{k}": v for k, v in NODE12.items()})
    assert task.result == Result.FAILURE
    assert (
        rows_of(task, 0)[-1]
        == f"##[error]DYNRUNNER_NODE is '{tmp_path / 'no-node-here'}', which is not an executable file"
    )
