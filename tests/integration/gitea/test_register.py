"""Register, Declare, Ping and the runner interceptor, through the real client."""

from __future__ import annotations

import re
import sqlite3

import pyqwest
import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, GiteaError, RunnerCredentials, Unauthenticated
from tests.fixtures.gitea_calls import POD, register


async def test_ping_needs_no_credentials(client: GiteaClient) -> None:
    assert await client.ping("runner-1") == "Hello, runner-1!"


async def test_register_returns_a_40_hex_token_and_echoes_ephemeral(gitea: GiteaDouble, client: GiteaClient) -> None:
    info = await client.register(
        name="eph", registration_token=gitea.registration_token, labels=["a", "b"], version="v9", ephemeral=True
    )
    assert re.fullmatch(r"[0-9a-f]{40}", info.token)
    assert re.fullmatch(r"[0-9a-f-]{36}", info.uuid)
    assert (info.name, info.version, info.labels, info.ephemeral) == ("eph", "v9", ("a", "b"), True)
    [runner] = gitea.runners()
    assert (runner.id, runner.ephemeral, runner.labels) == (info.id, True, ["a", "b"])


async def test_runner_token_is_stored_salted_and_hashed(gitea: GiteaDouble, client: GiteaClient) -> None:
    info = await client.register(name="r", registration_token=gitea.registration_token, labels=[])
    with sqlite3.connect(gitea.state_dir / "gitea.db") as conn:
        token_hash, salt = conn.execute("SELECT token_hash, token_salt FROM runner").fetchone()
    assert info.token not in (token_hash, salt)
    assert re.fullmatch(r"[0-9a-f]{100}", token_hash)  # PBKDF2-SHA256, 50-byte key, hex
    assert len(salt) == 10


async def test_registration_tokens_are_multi_use(gitea: GiteaDouble, client: GiteaClient) -> None:
    first = await client.register(name="r1", registration_token=gitea.registration_token, labels=[])
    second = await client.register(name="r2", registration_token=gitea.registration_token, labels=[])
    assert first.id != second.id


@pytest.mark.parametrize(
    ("name", "token", "message"),
    [
        ("", "tok", "missing runner token, name"),
        ("r", "", "missing runner token, name"),
        ("r", "no-such-token", "runner registration token not found"),
    ],
)
async def test_register_errors_are_plain_texts_coded_unknown(
    client: GiteaClient, name: str, token: str, message: str
) -> None:
    with pytest.raises(GiteaError) as caught:
        await client.register(name=name, registration_token=token, labels=[])
    assert caught.value.code == "Unknown"
    assert caught.value.wire == message


async def test_a_new_token_invalidates_older_ones_of_its_scope_only(gitea: GiteaDouble, client: GiteaClient) -> None:
    old_global = gitea.registration_token
    repo_token = gitea.new_registration_token(repo="owner/repo")
    new_global = gitea.new_registration_token()
    assert gitea.registration_token == new_global
    with pytest.raises(GiteaError) as caught:
        await client.register(name="r", registration_token=old_global, labels=[])
    assert caught.value.wire == "runner registration token has been invalidated, please use the latest one"
    await client.register(name="r", registration_token=repo_token, labels=[])  # other scope: still valid
    newer_repo_token = gitea.new_registration_token(repo="owner/repo")
    with pytest.raises(GiteaError):
        await client.register(name="r", registration_token=repo_token, labels=[])
    await client.register(name="r", registration_token=newer_repo_token, labels=[])


async def test_scoped_tokens_make_scoped_runners(gitea: GiteaDouble, client: GiteaClient) -> None:
    await client.register(name="org", registration_token=gitea.new_registration_token(owner="acme"), labels=[])
    await client.register(name="repo", registration_token=gitea.new_registration_token(repo="acme/app"), labels=[])
    org, repo = gitea.runners()
    assert org.owner_id > 0 and org.repo_id == 0
    assert repo.owner_id == 0 and repo.repo_id > 0


@pytest.mark.parametrize("credentials", [RunnerCredentials("", ""), RunnerCredentials("nope", "x")])
async def test_unknown_runners_are_unauthenticated(client: GiteaClient, credentials: RunnerCredentials) -> None:
    with pytest.raises(Unauthenticated) as caught:
        await client.with_credentials(credentials).fetch_task(0)
    assert caught.value.wire == "rpc error: code = Unauthenticated desc = unregistered runner"


async def test_a_wrong_token_is_unauthenticated(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    assert runner.credentials is not None
    forged = runner.with_credentials(RunnerCredentials(runner.credentials.uuid, "0" * 40))
    with pytest.raises(Unauthenticated):
        await forged.declare(labels=["x"])


async def test_declare_overwrites_labels_and_version_without_echoing_ephemeral(gitea: GiteaDouble) -> None:
    runner = await register(gitea, ["old"], ephemeral=True)
    declared = await runner.declare(labels=["new", "pod"], version="v2", capabilities=["cancelling"])
    assert (declared.labels, declared.version, declared.ephemeral, declared.token) == (("new", "pod"), "v2", False, "")
    [view] = gitea.runners()
    assert (view.labels, view.version, view.ephemeral, view.cancelling_support) == (["new", "pod"], "v2", True, True)


async def test_declare_sets_the_capabilities_header(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    assert runner.credentials is not None
    response = await pyqwest.Client().post(
        f"{gitea.url}/api/actions/runner.v1.RunnerService/Declare",
        headers={
            "content-type": "application/json",
            "x-runner-uuid": runner.credentials.uuid,
            "x-runner-token": runner.credentials.token,
        },
        content=b'{"version": "v1", "labels": ["a"]}',
    )
    assert response.status == 200
    assert response.headers["x-gitea-actions-capabilities"] == "job-summary"


async def test_heartbeats_are_debounced_like_gitea(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    await runner.fetch_task(0)
    [first] = gitea.runners()
    assert first.last_online > 0 and first.last_active == 0  # FetchTask is not "active"
    gitea.advance_clock(10)
    await runner.fetch_task(0)
    assert gitea.runners()[0].last_online == first.last_online  # < 30 s: not persisted
    gitea.advance_clock(25)
    await runner.fetch_task(0)
    assert gitea.runners()[0].last_online > first.last_online
    assert gitea.runners()[0].status == "idle"


async def test_runner_name_is_cut_like_gitea_cuts_display_strings(gitea: GiteaDouble, client: GiteaClient) -> None:
    """`util.EllipsisDisplayString(name, 255)`: 252 columns and "…" (CJK counting two)."""
    info = await client.register(name="n" * 300, registration_token=gitea.registration_token, labels=POD)
    assert info.name == "n" * 252 + "…"
    wide = await client.register(name="名" * 200, registration_token=gitea.registration_token, labels=POD)
    assert wide.name == "名" * 126 + "…"
