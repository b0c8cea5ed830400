"""Who reaches a VM's execd (issue 19 item 2). OpenSandbox's proxy route is exempt from the API
key: with a sandbox's id alone, a client read the job's assignment (runner token, task token,
secrets). With `secureAccess` (opensandbox-server 1.1 on Kubernetes behind its ingress gateway)
each sandbox's endpoints need a token of its own that only the API key can read; the backend's
delivery and start still work, through the SDK, which sends it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from dynrunner.controller.backends.base import BackendError, StartStage
from dynrunner.controller.backends.opensandbox.api import OpenSandboxError
from dynrunner.doubles.opensandbox import OpenSandboxDouble
from tests.fixtures.opensandbox import VM_IMAGE, OpenSandboxFactory
from tests.fixtures.opensandbox_backend import stand_in_image, vm_assignment, vm_backend

ASSIGNMENT = "/run/dynrunner/delivery.partial/assignment.pb"


async def _read_with_only_the_id(osb: OpenSandboxDouble, sandbox_id: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=osb.url) as client:
        return await client.get(f"/v1/sandboxes/{sandbox_id}/proxy/44772/files/download", params={"path": ASSIGNMENT})


async def test_without_secure_access_the_id_alone_reads_the_assignment(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """Upstream's behaviour, which is why job logs name no sandbox and the route must be
    unreachable from jobs and the network (docs/security.md)."""
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, "sleep 600\n")}) as osb,
        vm_backend(osb, tmp_path) as backend,
    ):
        env = await backend.create(vm_assignment())
        answer = await _read_with_only_the_id(osb, env.extra["sandbox"])
        assert answer.status_code == 200 and b"runner-token" in answer.content


async def test_with_secure_access_the_id_alone_is_refused_and_the_job_still_starts(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    async with (
        opensandbox_factory(
            images={VM_IMAGE: stand_in_image(tmp_path, "sleep 600\n")}, runtime="kubernetes", gateway=True
        ) as osb,
        vm_backend(osb, tmp_path, secure_access=True) as backend,
    ):
        env = await backend.create(vm_assignment())
        sandbox_id = env.extra["sandbox"]
        refused = await _read_with_only_the_id(osb, sandbox_id)
        assert refused.status_code == 401 and refused.json()["code"] == "MISSING_OR_INVALID_SECURE_ACCESS"
        async with httpx.AsyncClient(base_url=osb.url, headers={"OPEN-SANDBOX-API-KEY": osb.api_key}) as client:
            with_key = await client.get(
                f"/v1/sandboxes/{sandbox_id}/proxy/44772/files/download", params={"path": ASSIGNMENT}
            )
        assert with_key.status_code == 401  # the key alone is not the sandbox's token either
        events = [event async for event in backend.follow_start(env)]
        assert events[-1].stage is StartStage.STARTED
        assert (osb.sandbox(sandbox_id).rootfs / "run/dynrunner/delivery/assignment.pb").exists()


async def test_a_server_that_cannot_secure_access_refuses_the_vm(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """opensandbox-server's Docker runtime refuses `secureAccess`: the launch says so."""
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, "sleep 600\n")}) as osb,
        vm_backend(osb, tmp_path, secure_access=True) as backend,
    ):
        with pytest.raises(BackendError, match="secureAccess is not supported"):
            await backend.create(vm_assignment())
        assert osb.listed() == []


async def test_a_closed_client_sends_nothing_to_execd_either(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """A file API reached before `aclose` is refused after it, as the lifecycle API is: its
    closed transport would open a connection nobody closes."""
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, "sleep 600\n")}) as osb,
        vm_backend(osb, tmp_path) as backend,
    ):
        env = await backend.create(vm_assignment())
        files = await backend.api.files(env.extra["sandbox"], 10)
        await backend.api.aclose()
        served = sum(osb.requests.values())
        with pytest.raises(OpenSandboxError, match="is closed"):
            await files.write("/run/dynrunner/late", {"x": b"1"}, 600)
        with pytest.raises(OpenSandboxError, match="is closed"):
            await files.rename("/run/dynrunner/delivery.partial", "/run/dynrunner/delivery")
        assert sum(osb.requests.values()) == served
