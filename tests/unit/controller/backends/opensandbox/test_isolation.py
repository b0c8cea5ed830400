"""What `check` and the start say about a pool of VMs."""

from __future__ import annotations

from typing import Any

from dynrunner.controller.backends.opensandbox.api import OpenSandboxApi
from dynrunner.controller.backends.opensandbox.backend import OpenSandboxBackend
from dynrunner.controller.backends.opensandbox.builders import VmSettings
from dynrunner.controller.backends.opensandbox.config import OpenSandboxBackendConfig


async def _isolation(**options: Any) -> tuple[str, tuple[str, ...]]:
    config = OpenSandboxBackendConfig(url="https://osb.example.org", image="reg/vm:1", **options)
    backend = OpenSandboxBackend(VmSettings("vm", config, "example.org"), OpenSandboxApi.connect(config.url))
    try:
        said = backend.isolation()
    finally:
        await backend.aclose()
    return said.summary, said.warnings


async def test_a_pool_without_an_egress_policy_is_warned_about() -> None:
    summary, warnings = await _isolation()
    assert summary == (
        "one microVM per job on https://osb.example.org (image reg/vm:1), no workload identity, "
        "execd open to whoever reaches the server's proxy route with a sandbox id"
    )
    assert len(warnings) == 1 and "networkPolicy" in warnings[0]
    _, warnings = await _isolation(network_policy={"defaultAction": "allow"})
    assert warnings
    _, warnings = await _isolation(network_policy={"egress": [{"target": "gitea.example.org"}]})
    assert warnings == ()


async def test_a_pool_whose_vms_may_reach_the_opensandbox_server_is_warned_about() -> None:
    """Its proxy route opens a sandbox's execd to anyone with the sandbox's id."""
    for target in ("osb.example.org", "*.example.org"):
        _, warnings = await _isolation(network_policy={"egress": [{"target": target}]})
        assert len(warnings) == 1 and "proxy route" in warnings[0], target
    summary, warnings = await _isolation(
        network_policy={"egress": [{"target": "gitea.example.org"}]}, secure_access=True
    )
    assert summary.endswith("execd behind a token per VM (secureAccess)") and warnings == ()
