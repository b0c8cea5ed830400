"""The API module refuses requests once closed: its closed transport would otherwise open a
connection that nobody closes (as a sweep after the controller stopped did)."""

from __future__ import annotations

import pytest

from dynrunner.controller.backends.opensandbox.api import OpenSandboxApi, OpenSandboxError


async def test_a_closed_client_sends_nothing() -> None:
    api = OpenSandboxApi.connect("https://osb.example.org")
    await api.aclose()
    with pytest.raises(OpenSandboxError) as closed:
        await api.list({"dynrunner-pool": "vm"})
    assert "is closed" in str(closed.value) and not closed.value.transient
    with pytest.raises(OpenSandboxError):
        await api.delete("sb-1")
    assert sum(api.requests.values()) == 0
