"""The cache's limits under a job that pushes on them: parallel uploads against the staging
limits, one save after another against the entry cap."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from dynrunner.controller.cache.grants import grant_for_task, sign
from tests.fixtures.cache import CacheFactory, CacheFixture

MIB = 1024 * 1024
V2 = "/twirp/github.actions.results.api.v1.CacheService"
PARALLEL = 30


async def _register(http: aiohttp.ClientSession, cache: CacheFixture, token: str) -> dict[str, str]:
    context = {"repository": "acme/app", "ref": "refs/heads/main", "event": {"repository": {"id": 7}}}
    grant = grant_for_task(context, runtime_token=token, task_id=1, expires=int(time.time()) + 600, results_url="")
    body = {"grant": sign(grant, cache.grants.key), "token": token}
    async with http.post(f"{cache.url}/_dynrunner/register", json=body) as response:
        assert response.status == 200
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _staged(cache: CacheFixture) -> int:
    return sum(p.stat().st_size for p in cache.service.storage.staging.rglob("*") if p.is_file())


class Gate:
    """Holds every body after its first chunk until each request has begun (or was answered
    already), so the server has taken up every upload before any of them ends."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.open = asyncio.Event()

    def arrive(self) -> None:
        self.arrived += 1
        if self.arrived == self.parties:  # a moment for the server to take up the last ones' heads
            asyncio.get_running_loop().call_later(0.5, self.open.set)

    async def send(self, http: aiohttp.ClientSession, method: str, url: str, size: int, headers: dict[str, str]) -> int:
        arrived = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal arrived
            first = 64 * 1024
            yield b"p" * first
            arrived = True
            self.arrive()
            await self.open.wait()
            yield b"p" * (size - first)

        try:
            async with http.request(method, url, data=body(), headers=headers) as response:
                return response.status
        except aiohttp.ClientError:  # refused while the body was still being sent
            return 0
        finally:
            if not arrived:
                self.arrive()


async def test_parallel_uploads_stay_within_the_staging_limits(
    cache_server_factory: CacheFactory, http: aiohttp.ClientSession
) -> None:
    """30 PATCHes at different offsets, 30 Put Blocks with new ids and 30 entries uploaded at
    once, each piece under the entry limit: what is staged stays within 1 MiB per entry and
    2 MiB per repository (the room was computed once per piece, before its body streamed)."""
    piece = MIB - PARALLEL * 1000
    async with cache_server_factory(max_entry_bytes=MIB, repo_size_limit_bytes=2 * MIB) as cache:
        auth = await _register(http, cache, "tok")
        base = f"{cache.url}/_apis/artifactcache"
        async with http.post(f"{base}/caches", json={"key": "ranges", "version": "v"}, headers=auth) as response:
            entry = (await response.json())["cacheId"]
        gate = Gate(PARALLEL)
        statuses = await asyncio.gather(*(
            gate.send(http, "PATCH", f"{base}/caches/{entry}", piece,
                      auth | {"Content-Range": f"bytes {n * 1000}-{n * 1000 + piece - 1}/*"})
            for n in range(PARALLEL)
        ))  # fmt: skip
        assert statuses.count(204) == 1 and _staged(cache) <= MIB, (statuses, _staged(cache))

        async with http.post(
            f"{cache.url}{V2}/CreateCacheEntry", json={"key": "blocks", "version": "v"}, headers=auth
        ) as response:
            upload = (await response.json())["signed_upload_url"]
        gate = Gate(PARALLEL)
        statuses = await asyncio.gather(
            *(gate.send(http, "PUT", f"{upload}&comp=block&blockid=b{n}", piece, {}) for n in range(PARALLEL))
        )
        assert set(statuses) <= {201, 413, 429, 0} and _staged(cache) <= 2 * MIB, (statuses, _staged(cache))

    async with cache_server_factory(max_entry_bytes=MIB, repo_size_limit_bytes=2 * MIB) as cache:
        auth = await _register(http, cache, "tok")
        base = f"{cache.url}/_apis/artifactcache"
        entries = []
        for n in range(PARALLEL):
            async with http.post(f"{base}/caches", json={"key": f"k{n}", "version": "v"}, headers=auth) as response:
                entries.append((await response.json())["cacheId"])
        gate = Gate(PARALLEL)
        whole = auth | {"Content-Range": f"bytes 0-{piece - 1}/*"}
        statuses = await asyncio.gather(
            *(gate.send(http, "PATCH", f"{base}/caches/{entry}", piece, whole) for entry in entries)
        )
        assert statuses.count(204) == 2 and _staged(cache) <= 2 * MIB, (statuses, _staged(cache))


async def test_a_repository_keeps_at_most_its_entry_cap_however_small_the_entries(
    cache_server_factory: CacheFactory, http: aiohttp.ClientSession
) -> None:
    """Zero-byte entries count toward no size limit: the entry cap evicts the least recently
    used ones like the size limit does."""
    async with cache_server_factory(max_entries_per_repository=20) as cache:
        auth = await _register(http, cache, "tok")
        twirp = f"{cache.url}{V2}"
        for n in range(50):
            async with http.post(f"{twirp}/CreateCacheEntry", json={"key": f"k{n}", "version": "v"}, headers=auth) as r:
                upload = (await r.json())["signed_upload_url"]
            async with http.put(upload, data=b"") as r:
                assert r.status == 201
            body = {"key": f"k{n}", "version": "v", "size_bytes": 0}
            async with http.post(f"{twirp}/FinalizeCacheEntryUpload", json=body, headers=auth) as r:
                assert (await r.json())["ok"] is True
        keys = {e.key for e in cache.service.index.entries()}
        assert keys == {f"k{n}" for n in range(30, 50)}
