"""The ACTIONS_* variables the cache adds, and a cache that cannot be used leaving the job without one."""

from __future__ import annotations

import socket

import pytest

from dynrunner.executor import services
from dynrunner.executor.services import NONE, ActionsServices, open_services
from dynrunner.proto.assignment import CacheServiceOptions


def test_the_variables_follow_what_the_server_serves() -> None:
    assert NONE.env() == {}
    cache_only = ActionsServices(cache_url="http://cache:8089", v2=True, token="t")
    assert cache_only.env() == {"ACTIONS_CACHE_URL": "http://cache:8089/"}
    results = ActionsServices(cache_url="http://cache:8089", results_url="http://cache:8089", v2=True, token="t")
    assert results.env() == {
        "ACTIONS_CACHE_URL": "http://cache:8089/",
        "ACTIONS_RESULTS_URL": "http://cache:8089",
        "ACTIONS_CACHE_SERVICE_V2": "true",
    }
    assert "ACTIONS_CACHE_SERVICE_V2" not in ActionsServices("http://c", "http://c", False, "t").env()


async def test_no_cache_configured_or_no_grant_means_no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    warnings: list[str] = []
    assert await open_services(CacheServiceOptions(), "jwt", warnings.append) is NONE
    assert warnings == []
    assert await open_services(CacheServiceOptions(url="http://cache"), "jwt", warnings.append) is NONE
    assert warnings and "no cache grant" in warnings[0]


async def test_an_unreachable_cache_leaves_the_job_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "ATTEMPTS", 1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connection refused
        warnings: list[str] = []
        options = CacheServiceOptions(url=f"http://127.0.0.1:{port}", v2=True, grant="dcg1.x.y")
        assert await open_services(options, "jwt", warnings.append) is NONE
    assert len(warnings) == 1 and "runs without a cache" in warnings[0]
