"""Cache server throughput: save (v1: reserve, 8 MiB chunks in parallel, commit; v2: one Azure
Put Blob, finalize) and restore (lookup, download) of one archive through the HTTP API, with the
server in this process and its Filesystem store on a temp dir. Also the per-request cost of a
lookup (a miss and a hit), and of a listing (`GET caches?key=`) and a lookup for a repository
with a few entries while other repositories hold many (0 to 100,000 entries in the index).
Figures are printed, never asserted.

    .venv/bin/python -m pytest -q -s tests/bench/bench_cache.py     # 64 MiB
    DYNRUNNER_BENCH_SIZE_MB=512 .venv/bin/python -m pytest -q -s tests/bench/bench_cache.py
    .venv/bin/python -m pytest -q -s tests/bench/bench_cache.py -k many_entries
"""

from __future__ import annotations

import asyncio
import io
import os
import time
from pathlib import Path

import aiohttp

from dynrunner.controller.cache.grants import Grant, grant_for_task, sign
from dynrunner.controller.cache.index import Index
from tests.fixtures.cache import CacheFactory

MIB = 1024 * 1024
CHUNK = 8 * MIB
UPLOAD_CONCURRENCY = 4  # the toolkit's


def _size() -> int:
    return int(os.environ.get("DYNRUNNER_BENCH_SIZE_MB", "64")) * MIB


async def _register(http: aiohttp.ClientSession, url: str, key: bytes, token: str) -> None:
    context = {"repository": "bench/app", "ref": "refs/heads/main"}
    grant = grant_for_task(context, runtime_token=token, task_id=1, expires=int(time.time()) + 3600, results_url="")
    async with http.post(f"{url}/_dynrunner/register", json={"grant": sign(grant, key), "token": token}) as r:
        assert r.status == 200


async def _v1_save(http: aiohttp.ClientSession, url: str, auth: dict[str, str], data: bytes, key: str) -> None:
    async with http.post(f"{url}/_apis/artifactcache/caches", json={"key": key, "version": "v"}, headers=auth) as r:
        entry = (await r.json())["cacheId"]

    async def put(start: int) -> None:
        end = min(start + CHUNK, len(data)) - 1
        headers = auth | {"Content-Range": f"bytes {start}-{end}/*", "Content-Type": "application/octet-stream"}
        body = io.BytesIO(data[start : end + 1])
        async with http.patch(f"{url}/_apis/artifactcache/caches/{entry}", data=body, headers=headers) as r:
            assert r.status == 204

    starts = list(range(0, len(data), CHUNK))
    for first in range(0, len(starts), UPLOAD_CONCURRENCY):
        await asyncio.gather(*(put(start) for start in starts[first : first + UPLOAD_CONCURRENCY]))
    async with http.post(f"{url}/_apis/artifactcache/caches/{entry}", json={"size": len(data)}, headers=auth) as r:
        assert r.status == 204


async def _v2_save(http: aiohttp.ClientSession, url: str, auth: dict[str, str], data: bytes, key: str) -> None:
    twirp = f"{url}/twirp/github.actions.results.api.v1.CacheService"
    async with http.post(f"{twirp}/CreateCacheEntry", json={"key": key, "version": "v"}, headers=auth) as r:
        upload = (await r.json())["signed_upload_url"]
    async with http.put(upload, data=io.BytesIO(data), headers={"x-ms-blob-type": "BlockBlob"}) as r:
        assert r.status == 201
    body = {"key": key, "version": "v", "size_bytes": str(len(data))}
    async with http.post(f"{twirp}/FinalizeCacheEntryUpload", json=body, headers=auth) as r:
        assert (await r.json())["ok"]


async def _restore(http: aiohttp.ClientSession, url: str, auth: dict[str, str], key: str) -> int:
    async with http.get(f"{url}/_apis/artifactcache/cache?keys={key}&version=v", headers=auth) as r:
        location = (await r.json())["archiveLocation"]
    size = 0
    async with http.get(location) as r:
        async for chunk in r.content.iter_chunked(MIB):
            size += len(chunk)
    return size


async def test_cache_throughput(cache_server_factory: CacheFactory, tmp_path: Path) -> None:
    data = os.urandom(_size())
    limits = {"max_entry_bytes": 4 * len(data), "repo_size_limit_bytes": 16 * len(data)}
    async with cache_server_factory(**limits) as cache, aiohttp.ClientSession() as http:
        await _register(http, cache.url, cache.grants.key, "bench-token")
        auth = {"Authorization": "Bearer bench-token"}
        figures = {}
        for name, save in (("v1", _v1_save), ("v2", _v2_save)):
            started = time.perf_counter()
            await save(http, cache.url, auth, data, f"key-{name}")
            figures[f"{name} save"] = time.perf_counter() - started
            started = time.perf_counter()
            assert await _restore(http, cache.url, auth, f"key-{name}") == len(data)
            figures[f"{name} restore"] = time.perf_counter() - started
        lookups = 200
        for what, key in (("miss", "absent"), ("hit", "key-v1")):
            started = time.perf_counter()
            for _ in range(lookups):
                async with http.get(f"{cache.url}/_apis/artifactcache/cache?keys={key}&version=v", headers=auth) as r:
                    await r.read()
            figures[f"lookup {what}"] = (time.perf_counter() - started) / lookups
    mib = len(data) / MIB
    print(f"\ncache server, {mib:.0f} MiB archive, Filesystem store, loopback:")
    for name in ("v1 save", "v1 restore", "v2 save", "v2 restore"):
        print(f"  {name:<11} {figures[name]:6.2f} s  {mib / figures[name]:7.1f} MiB/s")
    for name in ("lookup miss", "lookup hit"):
        print(f"  {name:<11} {figures[name] * 1000:6.2f} ms per request")


async def test_listing_and_lookup_latency_with_many_entries(cache_server_factory: CacheFactory) -> None:
    """A repository's listing and lookup while the other repositories' entries grow: each
    query names one repository, so neither should grow with the index."""
    sizes = (0, 10_000, 100_000)
    async with cache_server_factory() as cache, aiohttp.ClientSession() as http:
        await _register(http, cache.url, cache.grants.key, "bench-token")
        auth = {"Authorization": "Bearer bench-token"}
        for n in range(5):
            await _v2_save(http, cache.url, auth, b"x", f"deps-{n}")
        index = cache.service.index
        added = 0
        figures: dict[int, tuple[float, float]] = {}
        for size in sizes:
            await asyncio.to_thread(_fill, index, added, size)
            added = size
            rounds = 200
            started = time.perf_counter()
            for _ in range(rounds):
                async with http.get(f"{cache.url}/_apis/artifactcache/caches?key=deps-1", headers=auth) as r:
                    assert (await r.json())["totalCount"] == 1
            listing = (time.perf_counter() - started) / rounds
            started = time.perf_counter()
            for _ in range(rounds):
                async with http.get(f"{cache.url}/_apis/artifactcache/cache?keys=deps-&version=v", headers=auth) as r:
                    assert r.status == 200
            lookup = (time.perf_counter() - started) / rounds
            figures[size] = (listing, lookup)
    print("\ncache server, one repository's 5 entries among others' (index entries: list / prefix lookup):")
    for size, (listing, lookup) in figures.items():
        print(f"  {size:>7} others  {listing * 1000:6.2f} ms  {lookup * 1000:6.2f} ms per request")


def _fill(index: Index, start: int, end: int) -> None:
    """Zero-byte entries of 100 other repositories, straight into the index."""
    for n in range(start, end):
        repo = n % 100
        other = Grant(f"other/r{repo}", "refs/heads/main", ("refs/heads/main",), f"t{repo}", 1, 2**40, "", repo)
        entry = index.reserve(other, f"deps-{n}", "v", max_pending=1)
        index.complete(entry.id, "", 0)
