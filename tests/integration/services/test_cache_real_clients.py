"""The cache service, driven by the real `@actions/cache` (what actions/cache@v4 bundles) from
`run:` steps of jobs the real executor runs, with the grant the controller issues: v1 and v2,
save in one run and restore in the next, other repositories refused, refs scoped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.cache import CacheFactory, CacheFixture
from tests.fixtures.clients import ActionClients
from tests.fixtures.executor import Claimed, ExecutorHarness
from tests.fixtures.s3 import S3Server

SAVE = """
on: push
jobs:
  save:
    runs-on: self-hosted
    steps:
      - run: |
          mkdir -p deps && head -c {size} /dev/urandom > deps/blob && printf 'v={marker}' > deps/marker
          node {clients}/cache.cjs save {key} deps {patched}
"""
RESTORE = """
on: push
jobs:
  restore:
    runs-on: self-hosted
    steps:
      - run: |
          node {clients}/cache.cjs restore {key} {restore_keys} deps {patched}
          cat deps/marker 2>/dev/null && echo || echo no-marker
"""


def _stored_archives(root: Path) -> int:
    return len([p for p in root.rglob("*") if p.is_file()])


def _answer(rows: list[str], field: str) -> object:
    for row in rows:
        if row.startswith("{") and field in row:
            return json.loads(row)[field]
    raise AssertionError(f"no client answer with {field!r} in the log:\n" + "\n".join(rows))


async def _run(harness: ExecutorHarness, cache: CacheFixture, workflow: str, **claim: object) -> list[str]:
    claimed: Claimed = cache.attach(await harness.claim(workflow, **claim))  # type: ignore[arg-type]
    assert await harness.run(claimed) == 0
    task = harness.gitea.task(claimed.task_id)
    assert task.status == "success", "\n".join(task.log_rows)
    return task.log_rows


@pytest.mark.parametrize("protocol", ["v1", "v2"])
async def test_a_cache_saved_in_one_run_is_restored_in_the_next(
    executor_harness: ExecutorHarness, cache_server: CacheFixture, action_clients: ActionClients, protocol: str
) -> None:
    patched = "--patched" if protocol == "v2" else ""  # v2 needs a client that takes the server for GitHub's
    fmt = {"clients": action_clients.root, "patched": patched, "size": 300_000}
    rows = await _run(executor_harness, cache_server, SAVE.format(key="deps-linux-1", marker="one", **fmt))
    assert isinstance(_answer(rows, "cacheId"), int) and _answer(rows, "cacheId") != -1
    [entry] = cache_server.service.index.entries()
    assert (entry.repo, entry.scope, entry.key, entry.complete) == (
        "owner/repo",
        "refs/heads/main",
        "deps-linux-1",
        True,
    )
    rows = await _run(executor_harness, cache_server, RESTORE.format(key="deps-linux-1", restore_keys="-", **fmt))
    assert _answer(rows, "matchedKey") == "deps-linux-1"
    assert "v=one" in rows
    rows = await _run(
        executor_harness, cache_server, RESTORE.format(key="deps-linux-2", restore_keys="deps-linux-", **fmt)
    )
    assert _answer(rows, "matchedKey") == "deps-linux-1"  # a restore key matches by prefix
    other = "v1" if protocol == "v2" else "v2"
    assert cache_server.server.requests[protocol] >= 4 and cache_server.server.requests[other] == 0


@pytest.mark.usefixtures("s3_credentials")
async def test_archives_can_live_in_s3(
    executor_harness: ExecutorHarness,
    cache_server_factory: CacheFactory,
    action_clients: ActionClients,
    s3_server: S3Server,
) -> None:
    bucket = s3_server.new_bucket()
    storage = {"driver": "S3", "bucket": bucket, "prefix": "ci-cache", "endpoint": s3_server.endpoint}
    async with cache_server_factory(storage=storage) as cache:
        fmt = {"clients": action_clients.root, "patched": "--patched", "size": 50_000}
        await _run(executor_harness, cache, SAVE.format(key="in-s3", marker="s3", **fmt))
        rows = await _run(executor_harness, cache, RESTORE.format(key="in-s3", restore_keys="-", **fmt))
        assert "v=s3" in rows
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert len(keys) == 1 and keys[0].startswith("ci-cache/owner/repo/cache/sha256/")


async def test_a_job_of_another_repository_sees_none_of_the_cache(
    executor_harness: ExecutorHarness, cache_server: CacheFixture, action_clients: ActionClients
) -> None:
    fmt = {"clients": action_clients.root, "patched": "", "size": 1000}
    await _run(executor_harness, cache_server, SAVE.format(key="secret-deps", marker="a", **fmt), repository="acme/a")
    rows = await _run(
        executor_harness,
        cache_server,
        RESTORE.format(key="secret-deps", restore_keys="secret", **fmt),
        repository="evil/b",
    )
    assert _answer(rows, "matchedKey") is None
    assert "no-marker" in rows


async def test_a_branch_restores_the_default_branch_cache_but_not_the_other_way_round(
    executor_harness: ExecutorHarness, cache_server: CacheFixture, action_clients: ActionClients
) -> None:
    fmt = {"clients": action_clients.root, "patched": "--patched", "size": 1000}
    await _run(executor_harness, cache_server, SAVE.format(key="k-main", marker="main", **fmt), ref="refs/heads/main")
    await _run(
        executor_harness, cache_server, SAVE.format(key="k-feature", marker="f", **fmt), ref="refs/heads/feature"
    )
    rows = await _run(
        executor_harness, cache_server, RESTORE.format(key="k-main", restore_keys="-", **fmt), ref="refs/heads/feature"
    )
    assert _answer(rows, "matchedKey") == "k-main"
    rows = await _run(
        executor_harness, cache_server, RESTORE.format(key="k-feature", restore_keys="-", **fmt), ref="refs/heads/main"
    )
    assert _answer(rows, "matchedKey") is None


@pytest.mark.parametrize("gitea_profile", ["1.24", "main"])
async def test_v4_artifacts_go_through_the_cache_server_to_gitea(
    executor_harness: ExecutorHarness, gitea: GiteaDouble, cache_server: CacheFixture, action_clients: ActionClients
) -> None:
    """ACTIONS_RESULTS_URL names the cache server; it forwards the artifact half to Gitea. On
    1.24 too, whose padded upload signature the blob client would otherwise break."""
    workflow = f"""
on: push
jobs:
  up:
    runs-on: self-hosted
    steps:
      - run: |
          echo "results=$ACTIONS_RESULTS_URL cache=$ACTIONS_CACHE_URL v2=$ACTIONS_CACHE_SERVICE_V2"
          mkdir out && echo through-the-proxy > out/f.txt
          node {action_clients.root}/artifact.cjs v4 upload proxied out f.txt --patched
          node {action_clients.root}/artifact.cjs v4 download proxied back --patched
          cat back/f.txt
"""
    rows = await _run(executor_harness, cache_server, workflow)
    url = cache_server.url
    assert f"results={url} cache={url}/ v2=true" in rows
    assert "through-the-proxy" in rows
    assert [a.name for a in gitea.artifacts(gitea.runs()[-1].id)] == ["proxied"]
    assert cache_server.server.requests["artifacts"] >= 4  # Create, Finalize, List, GetSignedURL


async def test_an_archive_over_the_entry_limit_is_not_saved_and_the_job_goes_on(
    executor_harness: ExecutorHarness, cache_server_factory: CacheFactory, action_clients: ActionClients
) -> None:
    async with cache_server_factory(max_entry_bytes=50_000, repo_size_limit_bytes=1_000_000) as cache:
        for patched in ("", "--patched"):
            fmt = {"clients": action_clients.root, "patched": patched, "size": 200_000}
            rows = await _run(executor_harness, cache, SAVE.format(key=f"big{patched}", marker="x", **fmt))
            assert _answer(rows, "cacheId") == -1
            assert any(r.startswith("##[warning]") and "Failed to save" in r for r in rows), rows
        assert [e for e in cache.service.index.entries() if e.complete] == []


async def test_the_least_recently_used_entries_go_when_a_repository_is_over_its_limit(
    executor_harness: ExecutorHarness, cache_server_factory: CacheFactory, action_clients: ActionClients
) -> None:
    async with cache_server_factory(repo_size_limit_bytes=250_000, max_entry_bytes=150_000) as cache:
        fmt = {"clients": action_clients.root, "patched": "", "size": 100_000}
        for key in ("lru-a", "lru-b"):
            await _run(executor_harness, cache, SAVE.format(key=key, marker=key, **fmt))
        await _run(executor_harness, cache, RESTORE.format(key="lru-a", restore_keys="-", **fmt))  # a is used again
        await _run(executor_harness, cache, SAVE.format(key="lru-c", marker="lru-c", **fmt))
        kept = sorted(e.key for e in cache.service.index.entries())
        assert kept == ["lru-a", "lru-c"]
        assert _stored_archives(Path(cache.config.dir or "", "blobs")) == 2
        assert cache.service.index.repo_size("owner/repo") <= 250_000
        rows = await _run(executor_harness, cache, RESTORE.format(key="lru-b", restore_keys="-", **fmt))
        assert _answer(rows, "matchedKey") is None
