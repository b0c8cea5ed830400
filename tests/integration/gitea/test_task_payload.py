"""The Task a claim returns: payload YAML, github context, secrets, vars, needs."""

from __future__ import annotations

import re
import time

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.gitea.yamlio import load as load_yaml  # YAML 1.2 booleans: `on` stays a key
from dynrunner.proto.gitea import GiteaClient, Result, Task
from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.gitea_calls import final_state, job, register, workflow

MATRIX = """
name: build-all
on:
  push:
    branches: [main]
env:
  GLOBAL: 1.10
run-name: release ${{ github.ref_name }}
jobs:
  build:
    name: build
    runs-on: ${{ matrix.os }}
    timeout-minutes: 30
    env:
      LEVEL: 2
    strategy:
      fail-fast: false
      matrix:
        os: [linux, mac]
        go: [1.21]
    outputs:
      artifact: ${{ steps.pack.outputs.name }}
    steps:
      - id: pack
        name: Pack
        run: echo "name=a-${{ matrix.os }}" >> $GITHUB_OUTPUT
        with:
          level: 3
        unknown-key: dropped
  publish:
    needs: [build]
    runs-on: linux
    if: ${{ always() }}
    steps:
      - uses: actions/checkout@v4
"""


async def claim(runner: GiteaClient) -> Task:
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    return fetched.task


async def test_the_payload_is_a_single_job_workflow_with_its_matrix_combination(gitea: GiteaDouble) -> None:
    runner = await register(gitea, ["linux"])
    gitea.submit("owner/repo", MATRIX, secrets={"DEPLOY": "s3cret"}, vars={"REGION": "eu"})
    task = await claim(runner)
    assert task.workflow_payload is not None
    doc = load_yaml(task.workflow_payload.decode())
    assert list(doc) == ["name", "on", "env", "jobs", "run-name"]
    assert doc["on"] == {"push": {"branches": ["main"]}}
    assert doc["env"] == {"GLOBAL": "1.10"}  # map[string]string keeps the text as written
    assert doc["run-name"] == "release main"
    assert list(doc["jobs"]) == ["build"]
    build = doc["jobs"]["build"]
    assert build["name"] == "build (1.21, linux)"
    assert build["runs-on"] == "linux"
    assert build["timeout-minutes"] == "30"
    assert build["strategy"] == {"fail-fast": "false", "matrix": {"go": [1.21], "os": ["linux"]}}
    assert build["outputs"] == {"artifact": "${{ steps.pack.outputs.name }}"}
    assert build["steps"] == [
        {
            "id": "pack",
            "name": "Pack",
            "run": 'echo "name=a-${{ matrix.os }}" >> $GITHUB_OUTPUT',
            "with": {"level": "3"},
        }
    ]
    assert "needs" not in build


async def test_needs_are_erased_from_the_payload_but_sent_as_task_needs(gitea: GiteaDouble) -> None:
    linux = await register(gitea, ["linux"], name="linux")
    mac = await register(gitea, ["mac"], name="mac")
    run = gitea.submit("owner/repo", MATRIX)
    first, second = await claim(linux), await claim(mac)
    await linux.update_task(final_state(first.id, Result.SUCCESS), {"artifact": "a-linux", "only-linux": "x"})
    await mac.update_task(final_state(second.id, Result.FAILURE), {"artifact": "", "only-mac": "y"})
    publish = await claim(linux)  # `if:` present: waiting although a need failed
    assert publish.workflow_payload is not None
    payload = load_yaml(publish.workflow_payload.decode())
    assert "needs" not in payload["jobs"]["publish"]
    assert payload["jobs"]["publish"]["if"] == "${{ always() }}"
    [build] = publish.needs
    need = publish.needs[build]
    assert build == "build"
    assert need.result is Result.FAILURE
    # later sibling's keys win; an empty value falls back to the earlier sibling's
    assert dict(need.outputs) == {"artifact": "a-linux", "only-mac": "y"}
    assert [j.needs for j in gitea.jobs(run.id)] == [[], [], ["build"]]


async def test_the_github_context_is_giteas(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    run = gitea.submit(
        "acme/app", workflow(job("build")), ref="refs/tags/v1.2", sha="c" * 40, workflow_file="release.yml"
    )
    task = await claim(runner)
    ctx = task.context
    assert ctx is not None
    assert ctx["run_id"] == str(run.id) and ctx["run_number"] == "1" and ctx["run_attempt"] == "1"
    assert ctx["server_url"] == gitea.url + "/"
    assert ctx["api_url"] == gitea.url + "/api/v1"
    assert ctx["repositoryUrl"] == gitea.url + "/acme/app"
    assert (ctx["repository"], ctx["repository_owner"]) == ("acme/app", "acme")
    assert (ctx["ref"], ctx["ref_name"], ctx["ref_type"], ctx["sha"]) == ("refs/tags/v1.2", "v1.2", "tag", "c" * 40)
    assert (ctx["job"], ctx["workflow"], ctx["event_name"]) == ("build", "release.yml", "push")
    assert ctx["event"]["after"] == "c" * 40 and ctx["event"]["repository"]["full_name"] == "acme/app"
    assert ctx["gitea_default_actions_url"] == "https://github.com"
    assert ctx["secret_source"] == "Actions" and ctx["graphql_url"] == ""
    assert ctx["token"] == task.secrets["GITEA_TOKEN"] == task.secrets["GITHUB_TOKEN"]
    assert re.fullmatch(r"[0-9a-f]{40}", ctx["token"])
    assert gitea.task(task.id).token == ctx["token"]
    second = gitea.submit("acme/app", workflow(job("build")))
    assert (await claim(runner)).context["run_number"] == "2"  # type: ignore[index]
    assert second.number == 2


async def test_the_runtime_token_is_an_hs256_jwt_with_giteas_claims(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    run = gitea.submit("owner/repo", workflow(job("build")))
    task = await claim(runner)
    assert task.context is not None
    token = task.context["gitea_runtime_token"]
    claims = gitea.decode_runtime_token(token)
    job_id = gitea.jobs(run.id)[0].id
    assert claims["scp"] == f"Actions.Results:{run.id}:{job_id}"
    assert (claims["TaskID"], claims["RunID"], claims["JobID"]) == (task.id, run.id, job_id)
    assert claims["ac"] == '[{"Scope":"","Permission":2}]'
    assert claims["nbf"] <= time.time() + 1
    assert claims["exp"] - claims["nbf"] == 4 * 3600  # 1 h + ENDLESS_TASK_TIMEOUT (3 h)
    with pytest.raises(ValueError, match="signature"):
        gitea.decode_runtime_token(token[:-2] + ("AA" if not token.endswith("AA") else "BB"))


async def test_secrets_and_vars_travel_with_the_task(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    gitea.submit("owner/repo", workflow(job("build")), secrets={"DEPLOY": "s3cret"}, vars={"REGION": "eu"})
    task = await claim(runner)
    assert dict(task.secrets) == {
        "GITHUB_TOKEN": task.context["token"],  # type: ignore[index]
        "GITEA_TOKEN": task.context["token"],  # type: ignore[index]
        "DEPLOY": "s3cret",
    }
    assert dict(task.vars) == {"REGION": "eu"}


async def test_fork_pull_requests_get_only_the_token_secrets(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    pull = {"pull_request": {"base": {"ref": "main", "sha": "b" * 40}, "head": {"ref": "feature"}}}
    gitea.submit(
        "owner/repo",
        workflow(job("build")),
        event_name="pull_request",
        event=pull,
        ref="refs/pull/3/merge",
        secrets={"DEPLOY": "s3cret"},
        is_fork_pull_request=True,
    )
    task = await claim(runner)
    assert set(task.secrets) == {"GITHUB_TOKEN", "GITEA_TOKEN"}
    assert task.context is not None
    assert (task.context["base_ref"], task.context["head_ref"]) == ("main", "feature")
    # git.RefName: the pull request number, and no ref type for a pull ref
    assert (task.context["ref_name"], task.context["ref_type"]) == ("3", "")


@pytest.mark.parametrize("name", ["GITHUB_TOKEN", "gitea_x", "CI", "ci", "1ABC", "A-B", ""])
def test_invalid_secret_and_variable_names_are_refused(gitea: GiteaDouble, name: str) -> None:
    with pytest.raises(ValueError, match="invalid variable or secret name"):
        gitea.submit("owner/repo", workflow(job("build")), secrets={name: "x"})
    with pytest.raises(ValueError, match="invalid variable or secret name"):
        gitea.submit("owner/repo", workflow(job("build")), vars={name: "x"})
    assert gitea.runs() == []


async def test_secret_and_variable_names_are_upper_cased(gitea: GiteaDouble) -> None:
    """`InsertEncryptedSecret`/`InsertVariable` store names upper-cased; variable values get
    `\\r\\n` normalized (`NormalizeStringEOL`), secret values are kept as given."""
    runner = await register(gitea)
    gitea.submit(
        "owner/repo", workflow(job("build")), secrets={"deploy_Key": "a\r\nb"}, vars={"region": "eu\r\nwest\r"}
    )
    task = await claim(runner)
    assert task.secrets["DEPLOY_KEY"] == "a\r\nb" and "deploy_Key" not in task.secrets
    assert dict(task.vars) == {"REGION": "eu\nwest\n"}


async def test_default_actions_url_self_points_at_the_instance(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(default_actions_url="self") as gitea:
        runner = await register(gitea)
        gitea.submit("owner/repo", workflow(job("build")))
        task = await claim(runner)
        assert task.context is not None
        assert task.context["gitea_default_actions_url"] == gitea.url


@pytest.mark.parametrize("gitea_profile", ["1.24", "1.25", "1.26", "main"])
async def test_the_push_event_and_triggering_actor_are_the_releases(gitea: GiteaDouble, gitea_profile: str) -> None:
    """What real 1.24.6, 1.25.5 and 1.26.4 gave a job (tests/peers/test_gitea_contexts.py):
    `triggering_actor` "" before main; the event's repository with every key of that
    release's `structs.Repository`; the pushed commit as `head_commit` and in `commits`, with
    `total_commits` 0 as Gitea sends it."""
    runner = await register(gitea)
    gitea.submit("acme/app", workflow(job("build")), sha="d" * 40, actor="alice")
    ctx = (await claim(runner)).context
    assert ctx is not None
    assert ctx["actor"] == "alice"
    assert ctx["triggering_actor"] == ("alice" if gitea_profile == "main" else "")
    event = ctx["event"]
    newer = {"1.24": set(), "1.25": {"allow_manual_merge", "autodetect_manual_merge", "has_code"}}.get(
        gitea_profile, {"allow_manual_merge", "autodetect_manual_merge", "has_code", "branch_count"}
    )
    keys = set(event["repository"])
    assert {"ssh_url", "permissions", "internal_tracker", "object_format_name", "updated_at"} <= keys
    assert keys & {"allow_manual_merge", "autodetect_manual_merge", "has_code", "branch_count"} == newer
    assert len(keys) == 58 + len(newer)  # 1.24.6: 58 keys, 1.26.4: 62
    assert {"login", "username", "email", "visibility", "created"} <= set(event["sender"])
    assert event["head_commit"]["id"] == "d" * 40 and event["commits"] == [event["head_commit"]]
    assert event["total_commits"] == 0
