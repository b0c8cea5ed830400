"""A launch that fails leaves nothing behind and nothing renewed: its sandbox is deleted, the
job's SPIRE entry and alias removed (issue 18 item 8: 16 failed launches left 16 sandboxes and
16 entries, renewed after their tasks were finalized); and a sandbox that never took its job is
not kept alive for the reaper to find later."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynrunner.controller.backends.base import BackendError
from dynrunner.controller.backends.opensandbox import builders
from dynrunner.controller.backends.opensandbox.config import SpireServerConfig
from dynrunner.doubles.spire.server import SpireServer
from tests.fixtures.opensandbox import VM_IMAGE, OpenSandboxFactory
from tests.fixtures.opensandbox_backend import stand_in_image, vm_assignment, vm_backend

RUN = "sleep 600\n"


async def test_a_launch_whose_spire_call_is_refused_removes_its_sandbox_and_the_jobs_entry(
    spire_server: SpireServer, opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    spire = SpireServerConfig(socket_path=spire_server.socket_path)
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, RUN)}) as osb,
        # The SPIRE server refuses a join token whose alias is in another trust domain
        # (INVALID_ARGUMENT), after the job's entry was made.
        vm_backend(osb, tmp_path, spire=spire, identity=True, trust_domain="elsewhere.example") as backend,
    ):
        for _attempt in range(3):
            with pytest.raises(BackendError, match="SPIRE"):
                await backend.create(vm_assignment())
        assert osb.listed() == []
        assert spire_server.state.entries.entries() == []
        await osb.advance(builders.MIN_TIMEOUT_S)
        await backend.watcher.sync(lambda _aid: None)
        assert backend.watcher.renewals == 0
        assert backend.api.requests["delete"] == 3


async def test_a_sandbox_that_never_took_its_job_is_not_renewed(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """A controller that died between create and staging leaves a sandbox `created`: once its
    start timeout passed it is a failed start for the reaper, not a job to keep alive."""
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, RUN)}) as osb,
        vm_backend(osb, tmp_path, start_timeout_s=60, lease_s=1200) as backend,
    ):
        a = vm_assignment()
        request = builders.sandbox_request(a, backend.settings, now=osb.clock.now())
        left = await backend.api.create(request)  # and the controller died: never staged
        await backend.watcher.sync(lambda _aid: None)
        expiry = osb.sandbox(left).expires_at
        await osb.advance(1200 - 60)  # past the start timeout, inside the renewal window
        await backend.watcher.sync(lambda _aid: None)
        assert backend.watcher.renewals == 0
        assert osb.sandbox(left).expires_at == expiry
