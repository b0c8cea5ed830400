"""Connections a job holds open do not starve the server (nor the controller it runs in): the
standalone server under a low file-descriptor limit, 100 connections stuck in their headers and
100 in their bodies, still answers /healthz and another job's save."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import yaml

from dynrunner.controller.cache.grants import grant_for_task, sign
from dynrunner.controller.cache.server import Timeouts
from dynrunner.controller.infra.sealing import ensure_key_file, read_key_file
from tests.fixtures.cache import CacheFactory
from tests.fixtures.harness import wait_for

CLI = str(Path(sys.executable).parent / "dynrunner-controller")
FD_LIMIT = 200
HELD = 100
PATIENCE_S = 60.0  # not a figure: how long a hung server gets before the test gives up


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@contextlib.asynccontextmanager
async def _standalone(tmp_path: Path) -> AsyncIterator[tuple[str, bytes]]:
    port = _free_port()
    key_file = ensure_key_file(tmp_path / "cache.key")
    cache = {"url": f"http://127.0.0.1:{port}", "listen": f"127.0.0.1:{port}", "keyFile": str(key_file),
             "dir": str(tmp_path / "cache")}  # fmt: skip
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"cache": cache, "logging": {"json": False}}))
    output = tmp_path / "cache-server.log"
    with output.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            CLI, "cache-server", "--config", str(config), preexec_fn=_low_fd_limit, stdout=sink, stderr=sink
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = asyncio.get_running_loop().time() + 90  # a start under load may be slow
        async with aiohttp.ClientSession() as http:
            while True:
                assert process.returncode is None, f"the cache server exited: {output.read_text()}"
                assert asyncio.get_running_loop().time() < deadline, f"never answered: {output.read_text()}"
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with http.get(f"{url}/healthz") as response:
                        if response.status == 200:
                            break
                await asyncio.sleep(0.1)
        yield url, read_key_file(key_file)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert await asyncio.wait_for(process.wait(), 60) == 0, output.read_text()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def _register(http: aiohttp.ClientSession, url: str, key: bytes, token: str, repo: str) -> dict[str, str]:
    context = {"repository": repo, "ref": "refs/heads/main", "event": {"repository": {"id": 3}}}
    grant = grant_for_task(context, runtime_token=token, task_id=1, expires=int(time.time()) + 600, results_url="")
    async with http.post(f"{url}/_dynrunner/register", json={"grant": sign(grant, key), "token": token}) as response:
        assert response.status == 200
    return {"Authorization": f"Bearer {token}"}


async def _save(http: aiohttp.ClientSession, url: str, auth: dict[str, str], key: str, data: bytes) -> None:
    base = f"{url}/_apis/artifactcache"
    async with http.post(f"{base}/caches", json={"key": key, "version": "v"}, headers=auth) as response:
        assert response.status == 200, await response.text()
        entry = (await response.json())["cacheId"]
    headers = auth | {"Content-Range": f"bytes 0-{len(data) - 1}/*"}
    async with http.patch(f"{base}/caches/{entry}", data=data, headers=headers) as response:
        assert response.status == 204, await response.text()
    async with http.post(f"{base}/caches/{entry}", json={"size": len(data)}, headers=auth) as response:
        assert response.status == 204, await response.text()


Held = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _hold(url: str, head: str, body: bytes = b"") -> Held | None:
    """A connection that sent `head` (and `body`) and nothing more (None: refused at once)."""
    _, port = url.rsplit(":", 1)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
        writer.write(head.encode() + body)
        await writer.drain()
    except OSError:
        return None
    return reader, writer


async def test_held_connections_leave_the_server_healthy_and_serving_other_jobs(tmp_path: Path) -> None:
    async with _standalone(tmp_path) as (url, key), aiohttp.ClientSession() as http:
        await _save(http, url, await _register(http, url, key, "hoarder", "evil/app"), "seed", b"x")
        base = f"{url}/_apis/artifactcache"
        async with http.post(
            f"{base}/caches", json={"key": "held", "version": "v"}, headers={"Authorization": "Bearer hoarder"}
        ) as response:
            entry = (await response.json())["cacheId"]
        held = [await _hold(url, "GET /healthz HTTP/1.1\r\nHost: cache\r\nX-Slow: ") for _ in range(HELD)]
        for n in range(HELD):
            head = (
                f"PATCH /_apis/artifactcache/caches/{entry} HTTP/1.1\r\nHost: cache\r\n"
                f"Authorization: Bearer hoarder\r\nContent-Range: bytes {n * 10}-{n * 10 + 9999}/*\r\n"
                "Content-Length: 10000\r\n\r\n"
            )
            held.append(await _hold(url, head, b"0123456789"))
        try:
            timeout = aiohttp.ClientTimeout(total=PATIENCE_S)
            async with http.get(f"{url}/healthz", timeout=timeout) as response:
                assert response.status == 200
            auth = await _register(http, url, key, "neighbour", "acme/app")
            await asyncio.wait_for(_save(http, url, auth, "deps", b"neighbour's archive"), PATIENCE_S)
        finally:
            for connection in held:
                if connection is not None:
                    connection[1].close()


async def test_a_stalled_request_head_or_body_is_ended(cache_server_factory: CacheFactory) -> None:
    """Half a request head: the connection is closed; half a body: 408, and the piece and its
    room are gone (the same piece uploads whole afterwards)."""
    async with cache_server_factory(timeouts=Timeouts(headers_s=1, body_s=1)) as cache, aiohttp.ClientSession() as http:
        head_only = await _hold(cache.url, "GET /healthz HTTP/1.1\r\nHost: cache\r\nX-Slow: ")
        auth = await _register(http, cache.url, cache.grants.key, "slow", "acme/app")
        async with http.post(
            f"{cache.url}/_apis/artifactcache/caches", json={"key": "k", "version": "v"}, headers=auth
        ) as response:
            entry = (await response.json())["cacheId"]
        head = (
            f"PATCH /_apis/artifactcache/caches/{entry} HTTP/1.1\r\nHost: cache\r\nAuthorization: Bearer slow\r\n"
            "Content-Range: bytes 0-9/*\r\nContent-Length: 10\r\n\r\n"
        )
        half_body = await _hold(cache.url, head, b"01234")
        assert head_only is not None and half_body is not None
        answer = await asyncio.wait_for(half_body[0].readline(), PATIENCE_S)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        with contextlib.suppress(ConnectionError):  # closed, or reset
            assert await asyncio.wait_for(head_only[0].read(), PATIENCE_S) == b""
        half_body[1].close()
        head_only[1].close()
        assert cache.service.staging.held(entry) == 0
        headers = auth | {"Content-Range": "bytes 0-9/*"}
        async with http.patch(
            f"{cache.url}/_apis/artifactcache/caches/{entry}", data=b"0123456789", headers=headers
        ) as r:
            assert r.status == 204


async def test_at_the_cap_idle_connections_make_room_and_busy_ones_stay(cache_server_factory: CacheFactory) -> None:
    """Four connections at most: an upload in progress on the oldest survives eight new
    connections that send nothing (each closes the longest idle one), and finishes."""
    async with cache_server_factory(max_connections=4) as cache, aiohttp.ClientSession() as http:
        auth = await _register(http, cache.url, cache.grants.key, "tok", "acme/app")
        async with http.post(
            f"{cache.url}/_apis/artifactcache/caches", json={"key": "k", "version": "v"}, headers=auth
        ) as response:
            entry = (await response.json())["cacheId"]
        await http.close()  # its pooled connection would be one of the four
        head = (
            f"PATCH /_apis/artifactcache/caches/{entry} HTTP/1.1\r\nHost: cache\r\nAuthorization: Bearer tok\r\n"
            "Content-Range: bytes 0-9/*\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"
        )
        busy = await _hold(cache.url, head, b"01234")
        assert busy is not None
        await wait_for(lambda: cache.service.staging.held(entry) == 10, within=PATIENCE_S, what="the upload's room")
        idle = [await _hold(cache.url, "") for _ in range(8)]
        guard = cache.server.connections
        assert guard is not None
        await wait_for(lambda: guard.evicted == 5, within=PATIENCE_S, what="five evictions")
        busy[1].write(b"56789")
        answer = await asyncio.wait_for(busy[0].readline(), PATIENCE_S)
        assert answer.startswith(b"HTTP/1.1 204"), answer
        for connection in idle:
            if connection is not None:
                connection[1].close()
        busy[1].close()
