"""The cache server at the wire: registration, who may do what, signed URLs, broken uploads.
(Both protocols with the real client: tests/integration/services/test_cache_real_clients.py.)"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yarl
from aiohttp import web

from dynrunner.controller.cache.grants import grant_for_task, sign
from tests.fixtures.cache import CacheFactory, CacheFixture

V2 = "/twirp/github.actions.results.api.v1.CacheService"


def _grant(
    cache: CacheFixture, token: str, repo: str = "acme/app", *, expires: float | None = None, results: str = ""
) -> str:
    context = {"repository": repo, "ref": "refs/heads/main", "event": {"repository": {"default_branch": "main"}}}
    grant = grant_for_task(
        context, runtime_token=token, task_id=1, expires=int(expires or time.time() + 600), results_url=results
    )
    return sign(grant, cache.grants.key)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _post(http: aiohttp.ClientSession, url: str, body: Any, token: str = "") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.post(url, json=body, headers=headers) as response:
        text = await response.text()
        return response.status, (await response.json(content_type=None)) if text else None


async def _register(http: aiohttp.ClientSession, cache: CacheFixture, token: str, **grant: Any) -> tuple[int, Any]:
    return await _post(
        http, f"{cache.url}/_dynrunner/register", {"grant": _grant(cache, token, **grant), "token": token}
    )


async def test_registration_wants_this_servers_grant_for_that_very_token(
    cache_server: CacheFixture, http: aiohttp.ClientSession
) -> None:
    url = f"{cache_server.url}/_dynrunner/register"
    status, body = await _post(http, url, {"grant": _grant(cache_server, "tok-a"), "token": "tok-b"})
    assert status == 403 and "another token" in body["message"]
    status, body = await _post(http, url, {"grant": "dcg1.e30.AAAA", "token": "tok-a"})
    assert status == 403
    status, body = await _register(http, cache_server, "tok-a", expires=time.time() - 1)
    assert status == 403 and "expired" in body["message"]
    assert await _register(http, cache_server, "tok-a") == (200, {"results_url": ""})
    assert await _register(http, cache_server, "tok-r", results="http://gitea") == (
        200,
        {"results_url": cache_server.url},
    )


async def test_only_registered_jobs_are_served_and_revocation_ends_it(
    cache_server: CacheFixture, http: aiohttp.ClientSession
) -> None:
    lookup = f"{cache_server.url}/_apis/artifactcache/cache?keys=k&version=v"
    async with http.get(lookup, headers={"Authorization": "Bearer nobody"}) as response:
        assert response.status == 401
    status, body = await _post(http, f"{cache_server.url}{V2}/GetCacheEntryDownloadURL", {"key": "k", "version": "v"})
    assert status == 401 and body["code"] == "unauthenticated"
    await _register(http, cache_server, "tok")
    async with http.get(lookup, headers={"Authorization": "Bearer tok"}) as response:
        assert response.status == 204
    assert (await _post(http, f"{cache_server.url}/_dynrunner/revoke", {"token": "tok"}))[0] == 204
    async with http.get(lookup, headers={"Authorization": "Bearer tok"}) as response:
        assert response.status == 401


async def test_a_reservation_is_written_only_by_the_job_that_made_it(
    cache_server: CacheFixture, http: aiohttp.ClientSession
) -> None:
    for token, repo in (("owner", "acme/app"), ("sibling", "acme/app"), ("stranger", "evil/repo")):
        await _register(http, cache_server, token, repo=repo)
    base = f"{cache_server.url}/_apis/artifactcache"
    status, body = await _post(http, f"{base}/caches", {"key": "k", "version": "v", "cacheSize": 3}, "owner")
    assert status == 200
    entry = body["cacheId"]
    for intruder in ("sibling", "stranger"):
        headers = {"Authorization": f"Bearer {intruder}", "Content-Range": "bytes 0-2/*"}
        async with http.patch(f"{base}/caches/{entry}", data=b"bad", headers=headers) as response:
            assert response.status == 403
        assert (await _post(http, f"{base}/caches/{entry}", {"size": 3}, intruder))[0] == 403
    status, body = await _post(http, f"{base}/caches", {"key": "k", "version": "v"}, "sibling")
    assert status == 409 and "another job" in body["message"]
    status, body = await _post(http, f"{base}/caches", {"key": "k", "version": "v", "cacheSize": 10**12}, "stranger")
    assert status == 400 and "limit" in body["message"]


async def test_an_upload_with_a_gap_is_refused_at_commit_and_forgotten(
    cache_server: CacheFixture, http: aiohttp.ClientSession
) -> None:
    await _register(http, cache_server, "tok")
    base = f"{cache_server.url}/_apis/artifactcache"
    _, body = await _post(http, f"{base}/caches", {"key": "gap", "version": "v"}, "tok")
    entry = body["cacheId"]
    headers = {"Authorization": "Bearer tok", "Content-Range": "bytes 5-9/*"}
    async with http.patch(f"{base}/caches/{entry}", data=b"12345", headers=headers) as response:
        assert response.status == 204
    status, body = await _post(http, f"{base}/caches/{entry}", {"size": 10}, "tok")
    assert status == 400 and "gap" in body["message"]
    assert cache_server.service.index.get(entry) is None


async def test_signed_urls_are_bound_to_their_entry_purpose_and_time(
    cache_server: CacheFixture, http: aiohttp.ClientSession
) -> None:
    await _register(http, cache_server, "tok")
    status, body = await _post(http, f"{cache_server.url}{V2}/CreateCacheEntry", {"key": "s", "version": "v"}, "tok")
    assert status == 200 and body["ok"] is True
    upload = body["signed_upload_url"]
    async with http.put(upload, data=b"archive", headers={"x-ms-blob-type": "BlockBlob"}) as response:
        assert response.status == 201 and response.headers["x-ms-request-id"]
    status, body = await _post(
        http, f"{cache_server.url}{V2}/FinalizeCacheEntryUpload", {"key": "s", "version": "v", "size_bytes": "7"}, "tok"
    )
    assert body == {"ok": True, "entry_id": body["entry_id"]}
    entry = int(body["entry_id"])
    as_download = upload.replace("/blobs/", "/artifacts/")
    async with http.get(as_download) as response:
        assert response.status == 401  # an upload URL is no download URL
    _, found = await _post(
        http,
        f"{cache_server.url}{V2}/GetCacheEntryDownloadURL",
        {"key": "s", "restore_keys": [], "version": "v"},
        "tok",
    )
    assert found["matched_key"] == "s"
    async with http.get(found["signed_download_url"]) as response:
        assert response.status == 200 and await response.read() == b"archive"
    past = int(time.time()) - 1
    expired = f"{cache_server.url}/_apis/artifactcache/artifacts/{entry}?exp={past}&sig="
    async with http.get(expired + cache_server.service.signature("download", entry, past)) as response:
        assert response.status == 401
    async with http.get(found["signed_download_url"].replace(f"/{entry}?", f"/{entry + 1}?")) as response:
        assert response.status == 401
    async with http.get(found["signed_download_url"] + "%C3%A9") as response:
        assert response.status == 401  # not a 500 from comparing non-ASCII text


async def test_the_artifact_forward_serves_only_registered_jobs_with_a_gitea(
    cache_server: CacheFixture, http: aiohttp.ClientSession
) -> None:
    url = f"{cache_server.url}/twirp/github.actions.results.api.v1.ArtifactService/ListArtifacts"
    assert (await _post(http, url, {}))[0] == 401
    await _register(http, cache_server, "no-gitea")
    assert (await _post(http, url, {}, "no-gitea"))[0] == 404


def _staged(cache: CacheFixture) -> int:
    return sum(p.stat().st_size for p in cache.service.storage.staging.rglob("*") if p.is_file())


async def test_uploads_never_stage_more_than_the_limits(
    cache_server_factory: CacheFactory, http: aiohttp.ClientSession
) -> None:
    """A job that keeps sending pieces — v1 ranges at new offsets, v2 blocks with new ids, one
    reservation after another — cannot fill the server's disk before any commit: an entry's
    staging stays within the entry limit, a repository's within its size limit."""
    async with cache_server_factory(max_entry_bytes=1000, repo_size_limit_bytes=3000) as cache:
        await _register(http, cache, "tok")
        base = f"{cache.url}/_apis/artifactcache"
        _, body = await _post(http, f"{base}/caches", {"key": "ranges", "version": "v"}, "tok")
        statuses = []
        for start in range(0, 1000, 100):
            headers = {"Authorization": "Bearer tok", "Content-Range": f"bytes {start}-{start + 899}/*"}
            async with http.patch(f"{base}/caches/{body['cacheId']}", data=b"r" * 900, headers=headers) as response:
                statuses.append(response.status)
        assert statuses[0] == 204 and set(statuses[1:]) == {413}
        assert _staged(cache) <= 1000

        _, created = await _post(http, f"{cache.url}{V2}/CreateCacheEntry", {"key": "blocks", "version": "v"}, "tok")
        upload = created["signed_upload_url"]
        statuses = []
        for block in range(10):
            async with http.put(f"{upload}&comp=block&blockid=b{block}", data=b"b" * 400) as response:
                statuses.append(response.status)
        assert statuses[:2] == [201, 201] and set(statuses[2:]) == {413}
        async with http.put(f"{upload}&comp=block&blockid=b0", data=b"c" * 400) as response:
            assert response.status == 201  # a block sent again replaces itself
        assert _staged(cache) <= 1000 + 1000

        statuses = []
        for n in range(6):
            _, reserved = await _post(http, f"{base}/caches", {"key": f"more-{n}", "version": "v"}, "tok")
            headers = {"Authorization": "Bearer tok", "Content-Range": "bytes 0-899/*"}
            async with http.patch(f"{base}/caches/{reserved['cacheId']}", data=b"m" * 900, headers=headers) as response:
                statuses.append(response.status)
        assert statuses[:1] == [204] and set(statuses[1:]) == {413}
        assert _staged(cache) <= 3000


async def test_a_repository_sees_nothing_of_another_ones_cache_whatever_the_key(
    cache_server: CacheFixture, http: aiohttp.ClientSession
) -> None:
    """Keys are opaque strings: one with `..` or `/` is stored and found as written, in its own
    repository only, and no request of another repository lists, restores or overwrites it."""
    await _register(http, cache_server, "owner", repo="acme/app")
    await _register(http, cache_server, "stranger", repo="evil/repo")
    key = "../../evil/repo/cache/../x"
    _, created = await _post(http, f"{cache_server.url}{V2}/CreateCacheEntry", {"key": key, "version": "v"}, "owner")
    async with http.put(created["signed_upload_url"], data=b"secret") as response:
        assert response.status == 201
    _, body = await _post(
        http, f"{cache_server.url}{V2}/FinalizeCacheEntryUpload", {"key": key, "version": "v", "size_bytes": 6}, "owner"
    )
    assert body["ok"] is True
    [entry] = cache_server.service.index.entries()
    assert re.fullmatch(r"acme/app/cache/sha256/[0-9a-f]{64}", entry.location)
    for keys in ([key], ["../"], ["."], [".."]):
        _, found = await _post(
            http,
            f"{cache_server.url}{V2}/GetCacheEntryDownloadURL",
            {"key": keys[0], "restore_keys": [], "version": "v"},
            "stranger",
        )
        assert found == {"ok": False}
    async with http.get(
        f"{cache_server.url}/_apis/artifactcache/caches",
        params={"key": key},
        headers={"Authorization": "Bearer stranger"},
    ) as response:
        assert (await response.json())["totalCount"] == 0
    _status, body = await _post(
        http, f"{cache_server.url}{V2}/CreateCacheEntry", {"key": key, "version": "v"}, "stranger"
    )
    assert body["ok"] is True  # its own, separate entry
    assert cache_server.service.index.lookup(cache_server.service.job("owner"), [key], "v") == entry


async def test_the_artifact_forward_reaches_only_the_artifact_service(
    cache_server_factory: CacheFactory, http: aiohttp.ClientSession
) -> None:
    """The forward to Gitea passes on the job's token: a method name that climbs out of the
    artifact service (`..`, encoded slashes) is not forwarded anywhere else on Gitea."""
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({})

    upstream = web.Application()
    upstream.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(upstream)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    gitea = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with cache_server_factory() as cache:
            await _register(http, cache, "tok", results=gitea)
            service = f"{cache.url}/twirp/github.actions.results.api.v1.ArtifactService"
            assert (await _post(http, f"{service}/ListArtifacts", {}, "tok"))[0] == 200
            for method in (
                "..%2F..%2Fapi%2Fv1%2Fuser",
                "%2E%2E%2F%2E%2E%2Fapi",
                "..%5C..%5Capi",
                "x%2F..%2F..%2F..%2Fapi",
            ):
                async with http.post(
                    yarl.URL(f"{service}/{method}", encoded=True), json={}, headers={"Authorization": "Bearer tok"}
                ) as response:
                    await response.read()
            assert seen and all(
                path.startswith("/twirp/github.actions.results.api.v1.ArtifactService/") and ".." not in path
                for path in seen
            ), seen
    finally:
        await runner.cleanup()


async def test_a_revoked_token_cannot_register_again_with_its_grant(
    cache_server: CacheFixture, http: aiohttp.ClientSession
) -> None:
    """The grant sits in the assignment the job's own user reads: once revoked, registering the
    same grant and token again is refused until the grant would have expired anyway."""
    grant = _grant(cache_server, "tok")
    url = f"{cache_server.url}/_dynrunner/register"
    assert (await _post(http, url, {"grant": grant, "token": "tok"}))[0] == 200
    assert (await _post(http, f"{cache_server.url}/_dynrunner/revoke", {"token": "tok"}))[0] == 204
    status, body = await _post(http, url, {"grant": grant, "token": "tok"})
    assert status == 403 and "revoked" in body["message"]
    lookup = f"{cache_server.url}/_apis/artifactcache/cache?keys=k&version=v"
    async with http.get(lookup, headers={"Authorization": "Bearer tok"}) as response:
        assert response.status == 401


async def _save_v2(http: aiohttp.ClientSession, cache: CacheFixture, token: str, key: str, data: bytes) -> None:
    _, created = await _post(http, f"{cache.url}{V2}/CreateCacheEntry", {"key": key, "version": "v"}, token)
    async with http.put(created["signed_upload_url"], data=data) as response:
        assert response.status == 201
    body = {"key": key, "version": "v", "size_bytes": len(data)}
    assert (await _post(http, f"{cache.url}{V2}/FinalizeCacheEntryUpload", body, token))[1]["ok"] is True


async def test_malformed_fields_are_refused_naming_the_field(
    cache_server_factory: CacheFactory, http: aiohttp.ClientSession
) -> None:
    async with cache_server_factory(max_entry_bytes=1000, repo_size_limit_bytes=1000) as cache:
        await _register(http, cache, "tok")
        await _save_v2(http, cache, "tok", "a-key", b"x")
        url = f"{cache.url}{V2}/GetCacheEntryDownloadURL"
        for restore_keys in (5, "abc", [1], {"a": 1}):
            status, body = await _post(
                http, url, {"key": "zzz", "restore_keys": restore_keys, "version": "v"}, "tok"
            )  # a string was split into the one-letter prefixes "a", "b", "c" and matched "a-key"
            assert status == 400 and "restore_keys" in body["msg"], (restore_keys, status, body)
        async with http.post(url, data=b"[" * 100_000, headers={"Authorization": "Bearer tok"}) as response:
            assert response.status == 400  # nested too deep for the parser: was a 500
        status, body = await _post(http, url, {"key": 7, "version": "v"}, "tok")
        assert status == 400 and "key" in body["msg"]
        status, body = await _post(http, url, {"key": "\ud800", "version": "v"}, "tok")
        assert status == 400 and body["code"] == "invalid_argument"
        base = f"{cache.url}/_apis/artifactcache"
        status, body = await _post(http, f"{base}/caches", {"key": "k", "version": "v", "cacheSize": "big"}, "tok")
        assert status == 400 and "cacheSize" in body["message"]
        _, reserved = await _post(http, f"{base}/caches", {"key": "k", "version": "v"}, "tok")
        headers = {"Authorization": "Bearer tok", "Content-Range": "bytes 0-1/*"}
        async with http.patch(f"{base}/caches/{10**30}", data=b"xx", headers=headers) as response:
            assert response.status == 404  # an id SQLite cannot hold was a 500
        for content_range in ("bytes 1000-1001/*", "bytes 5-2/*"):
            headers = {"Authorization": "Bearer tok", "Content-Range": content_range}
            async with http.patch(f"{base}/caches/{reserved['cacheId']}", data=b"xx", headers=headers) as response:
                assert response.status == 400, (content_range, await response.text())


def _context(repo: str, repo_id: int) -> dict[str, Any]:
    repository = {"id": repo_id, "default_branch": "main"}
    return {"repository": repo, "ref": "refs/heads/main", "event": {"repository": repository}}


async def _register_as(http: aiohttp.ClientSession, cache: CacheFixture, token: str, context: dict[str, Any]) -> None:
    grant = grant_for_task(context, runtime_token=token, task_id=1, expires=int(time.time()) + 600, results_url="")
    body = {"grant": sign(grant, cache.grants.key), "token": token}
    assert (await _post(http, f"{cache.url}/_dynrunner/register", body))[0] == 200


async def test_entries_belong_to_the_repository_id_not_only_its_name(
    cache_server: CacheFixture, http: aiohttp.ClientSession
) -> None:
    """A repository deleted and created again under the same name (or another one transferred
    to that name) is a new repository: it does not inherit the old one's caches."""
    await _register_as(http, cache_server, "old", _context("acme/app", 41))
    await _save_v2(http, cache_server, "old", "deps", b"old repository's archive")
    await _register_as(http, cache_server, "same", _context("acme/app", 41))
    await _register_as(http, cache_server, "recreated", _context("acme/app", 42))
    url = f"{cache_server.url}{V2}/GetCacheEntryDownloadURL"
    assert (await _post(http, url, {"key": "deps", "version": "v"}, "same"))[1]["ok"] is True
    assert (await _post(http, url, {"key": "deps", "version": "v"}, "recreated"))[1] == {"ok": False}


async def test_a_signed_url_from_before_a_lost_index_serves_nothing_after_it(
    cache_server_factory: CacheFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Entry ids are the index's: after the index is lost they could name another repository's
    entry, while download URLs signed before still live for minutes."""
    settings = {"dir": tmp_path / "kept", "key_file": tmp_path / "kept" / "cache.key"}
    async with cache_server_factory(**settings) as cache:
        await _register_as(http, cache, "a", _context("acme/app", 1))
        await _save_v2(http, cache, "a", "deps", b"acme's archive")
        _, found = await _post(http, f"{cache.url}{V2}/GetCacheEntryDownloadURL", {"key": "deps", "version": "v"}, "a")
        old_url = yarl.URL(found["signed_download_url"])
    for name in ("index.db", "index.db-wal", "index.db-shm"):
        (tmp_path / "kept" / name).unlink(missing_ok=True)
    async with cache_server_factory(**settings) as cache:
        await _register_as(http, cache, "b", _context("evil/other", 2))
        await _save_v2(http, cache, "b", "deps", b"evil's archive")
        async with http.get(old_url.with_port(yarl.URL(cache.url).port)) as response:
            assert response.status == 401, await response.read()
