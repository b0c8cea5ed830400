"""The OpenSandbox double through the official SDK (figures only, no assertions on time).

Run: `make bench`. Figures: lifecycle calls per second (create answered Running in the
Docker runtime, i.e. the entrypoint process started in its mount namespace; get; list by
metadata; delete, i.e. the session killed), and one delivery round trip: files written
through execd and renamed into place until the entrypoint inside the sandbox has read them.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from opensandbox import Sandbox, SandboxManager
from opensandbox.adapters.factory import AdapterFactory
from opensandbox.models.filesystem import MoveEntry, WriteEntry
from opensandbox.models.sandboxes import SandboxFilter, SandboxImageSpec

from tests.fixtures.opensandbox import SHELL_IMAGE, OpenSandboxFactory, sdk_config

SANDBOXES = 40


async def test_lifecycle_rates(opensandbox_factory: OpenSandboxFactory) -> None:
    async with opensandbox_factory() as osb:
        config = sdk_config(osb).with_transport_if_missing()
        service = AdapterFactory(config).create_sandbox_service()
        manager = await SandboxManager.create(connection_config=config)
        timings: dict[str, list[float]] = {"create": [], "get": [], "list": [], "delete": []}
        ids = []
        for i in range(SANDBOXES):
            started = time.perf_counter()
            created = await service.create_sandbox(
                spec=SandboxImageSpec(image=SHELL_IMAGE), entrypoint=["sleep", "600"], env={}, timeout=None,
                metadata={"n": str(i)}, resource={"cpu": "1"}, network_policy=None, credential_proxy=None,
                extensions={}, volumes=None, platform=None, secure_access=False, snapshot_id=None,
                resource_requests=None, lifecycle=None,
            )  # fmt: skip
            timings["create"].append(time.perf_counter() - started)
            ids.append(created.id)
        for i, sandbox_id in enumerate(ids):
            started = time.perf_counter()
            await manager.get_sandbox_info(sandbox_id)
            timings["get"].append(time.perf_counter() - started)
            started = time.perf_counter()
            await manager.list_sandbox_infos(SandboxFilter(metadata={"n": str(i)}))
            timings["list"].append(time.perf_counter() - started)
        for sandbox_id in ids:
            started = time.perf_counter()
            await manager.kill_sandbox(sandbox_id)
            timings["delete"].append(time.perf_counter() - started)
        await manager.close()
        await config.close_transport_if_owned()
    print(f"\nOpenSandbox double, {SANDBOXES} sandboxes, official SDK over HTTP:")
    for name, values in timings.items():
        print(
            f"  {name:6s} median {statistics.median(values) * 1000:6.1f} ms  "
            f"p90 {sorted(values)[int(len(values) * 0.9)] * 1000:6.1f} ms  {len(values) / sum(values):7.1f}/s"
        )


async def test_delivery_round_trip(opensandbox_factory: OpenSandboxFactory) -> None:
    async with opensandbox_factory() as osb:
        rounds = []
        for _ in range(10):
            started = time.perf_counter()
            sandbox = await Sandbox.create(
                SHELL_IMAGE,
                entrypoint=["sh", "-c", "until [ -d /run/d ]; do sleep 0.01; done; cat /run/d/a"],
                connection_config=sdk_config(osb),
            )
            ready = time.perf_counter()
            await sandbox.files.write_files([WriteEntry(path="/run/d.partial/a", data=b"x" * 65536, mode=600)])
            await sandbox.files.move_files([MoveEntry(src="/run/d.partial", dest="/run/d")])
            await osb.wait_for_state(sandbox.id, "Terminated")
            rounds.append((ready - started, time.perf_counter() - ready))
            await sandbox.kill()
            await sandbox.close()
            await asyncio.sleep(0)
    print("\nSandbox.create until execd answers, then a 64 KiB delivery until the entrypoint read it and exited:")
    print(f"  create+ready median {statistics.median(r[0] for r in rounds) * 1000:.1f} ms")
    print(f"  delivery→exit median {statistics.median(r[1] for r in rounds) * 1000:.1f} ms")
