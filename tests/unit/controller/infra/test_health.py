"""The health server: /healthz, /readyz with the reason, /metrics, on a free port."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from dynrunner.controller.infra.health import HealthServer, parse_address
from dynrunner.controller.infra.metrics import Metrics


async def get(url: str, accept: str = "") -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as http, http.get(url, headers={"Accept": accept} if accept else {}) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_endpoints_answer_by_state() -> None:
    state = {"ready": (False, "NATS not connected")}
    metrics = Metrics()
    metrics.capacity.labels(pool="pod").set(4)
    async with HealthServer("127.0.0.1:0", metrics, lambda: state["ready"]) as srv:
        assert srv.url.startswith("http://127.0.0.1:") and not srv.url.endswith(":0")
        assert await get(f"{srv.url}/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        status, _, body = await get(f"{srv.url}/readyz")
        assert (status, body) == (503, "not ready: NATS not connected\n")
        state["ready"] = (True, "")
        assert (await get(f"{srv.url}/readyz"))[::2] == (200, "ready\n")
        status, ctype, body = await get(f"{srv.url}/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=")
        assert 'dynrunner_capacity{pool="pod"} 4.0' in body
        status, ctype, body = await get(f"{srv.url}/metrics", accept="application/openmetrics-text")
        assert ctype.startswith("application/openmetrics-text") and body.endswith("# EOF\n")
        assert (await get(f"{srv.url}/nothing"))[0] == 404


async def test_a_failing_readiness_check_reports_not_ready() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("claimer state unknown")

    async with HealthServer("127.0.0.1:0", Metrics(), broken) as srv:
        status, _, body = await get(f"{srv.url}/readyz")
    assert status == 503 and "readiness check failed: claimer state unknown" in body


async def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port} for metrics/health"):
            async with HealthServer(f"127.0.0.1:{port}", Metrics(), lambda: (True, "")):
                pass


async def test_server_stops_listening_after_exit() -> None:
    async with HealthServer("127.0.0.1:0", Metrics(), lambda: (True, "")) as srv:
        url = srv.url
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(f"{url}/healthz")


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address(":9464") == ("0.0.0.0", 9464)
    assert parse_address("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="must be host:port"):
        parse_address("9464")


async def test_healthz_says_why_the_process_is_not_healthy() -> None:
    state = [(True, "")]
    async with HealthServer("127.0.0.1:0", Metrics(), lambda: (True, ""), lambda: state[0]) as srv:
        assert (await get(f"{srv.url}/healthz"))[0] == 200
        state[0] = (False, "the embedded nats-server is down")
        status, _, body = await get(f"{srv.url}/healthz")
        assert (status, body) == (503, "not healthy: the embedded nats-server is down\n")
