"""What a job costs the OpenSandbox server, as the double counts it: while the pool's watch runs,
`find` and `observe` answer from its last list, so a job's lifecycle reads (lists and gets,
beside the watch's own lists) are at most two — eight lists and three gets before."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynrunner.controller.backends.base import Phase, StartStage
from dynrunner.controller.backends.opensandbox.backend import OpenSandboxBackend
from dynrunner.doubles.opensandbox import OpenSandboxDouble
from tests.fixtures.opensandbox import VM_IMAGE, OpenSandboxFactory
from tests.fixtures.opensandbox_backend import stand_in_image, vm_assignment, vm_backend

READS = ("GET /sandboxes", "GET /sandboxes/{id}")


def reads(osb: OpenSandboxDouble, backend: OpenSandboxBackend) -> int:
    """Lifecycle reads beside the watch's lists."""
    return sum(osb.requests[kind] for kind in READS) - backend.watcher.lists


async def test_a_job_costs_at_most_two_lifecycle_reads_beside_the_watch(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, "exit 0\n")}) as osb,
        vm_backend(osb, tmp_path) as backend,
    ):
        watching = asyncio.create_task(backend.watch(lambda _aid: None))
        try:
            await backend.watcher.synced.wait()
            a = vm_assignment()
            assert await backend.find(a.assignment_id) is None  # the launcher's look before create
            env = await backend.create(a)
            events = [event async for event in backend.follow_start(env)]
            assert events[-1].stage is StartStage.STARTED
            await osb.wait_for_state(env.extra["sandbox"], "Terminated")
            for _ in range(2):  # a list that began after it ended
                backend.watcher.synced.clear()
                await backend.watcher.synced.wait()
            found = await backend.find(a.assignment_id)
            assert found is not None
            assert (await backend.observe(found)).phase is Phase.SUCCEEDED
            await backend.delete(found)
            assert osb.listed() == []
            assert reads(osb, backend) <= 2, dict(osb.requests)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
