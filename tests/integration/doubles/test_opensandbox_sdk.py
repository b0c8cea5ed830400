"""The OpenSandbox double on a real port, driven by the SDK: sandboxes are processes that see
their own /run, execd's file API writes into it, and the Kubernetes runtime's Pending phase."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.filesystem import MoveEntry

from dynrunner.doubles.opensandbox import OpenSandboxDouble
from tests.fixtures.opensandbox import SHELL_IMAGE, OpenSandboxFactory, sdk_config

WAIT_FOR_DELIVERY = [
    "sh",
    "-c",
    "until [ -d /run/dynrunner/delivery ]; do sleep 0.02; done; "
    'cat /run/dynrunner/delivery/assignment; stat -c %a /run/dynrunner/delivery/assignment; echo "A=$A"',
]


async def test_files_written_through_execd_appear_at_the_same_path_inside_the_sandbox(
    opensandbox: OpenSandboxDouble,
) -> None:
    config = sdk_config(opensandbox)
    sandbox = await Sandbox.create(
        SHELL_IMAGE,
        entrypoint=WAIT_FOR_DELIVERY,
        env={"A": "1"},
        timeout=timedelta(minutes=5),
        connection_config=config,
    )
    await sandbox.files.write_file("/run/dynrunner/partial/assignment", b"payload\n", mode=600)
    await sandbox.files.move_files([MoveEntry(src="/run/dynrunner/partial", dest="/run/dynrunner/delivery")])
    box = await opensandbox.wait_for_state(sandbox.id, "Terminated", "Failed")
    assert box.status.state == "Terminated"
    assert box.console.read_text().splitlines() == ["payload", "600", "A=1"]
    assert not (box.rootfs.parent.parent / "run" / "dynrunner").exists()  # not the host's /run
    await sandbox.kill()
    await sandbox.close()


async def test_a_second_delivery_cannot_replace_the_first(opensandbox: OpenSandboxDouble) -> None:
    config = sdk_config(opensandbox)
    sandbox = await Sandbox.create(
        SHELL_IMAGE, entrypoint=["sleep", "600"], timeout=timedelta(minutes=5), connection_config=config
    )
    for content in (b"first", b"second"):
        await sandbox.files.write_file("/run/in/x", content)
    await sandbox.files.move_files([MoveEntry(src="/run/in", dest="/run/done")])
    await sandbox.files.write_file("/run/in/x", b"third")
    with pytest.raises(SandboxApiException) as refused:
        await sandbox.files.move_files([MoveEntry(src="/run/in", dest="/run/done")])
    assert refused.value.status_code == 500
    assert await sandbox.files.read_file("/run/done/x") == "second"
    await sandbox.kill()
    await sandbox.close()


async def test_kubernetes_runtime_answers_pending_and_the_sdk_waits_for_the_endpoint(
    opensandbox_factory: OpenSandboxFactory,
) -> None:
    async with opensandbox_factory(runtime="kubernetes", boot_delay_s=0.3) as osb:
        config = sdk_config(osb)
        async with httpx.AsyncClient(base_url=osb.url, headers={"OPEN-SANDBOX-API-KEY": osb.api_key}) as client:
            created = await client.post(
                "/v1/sandboxes",
                json={"image": {"uri": SHELL_IMAGE}, "entrypoint": ["sleep", "600"], "resourceLimits": {}},
            )
            assert created.status_code == 202 and created.json()["status"]["state"] == "Pending"
            early = await client.get(f"/v1/sandboxes/{created.json()['id']}/endpoints/44772")
            assert (early.status_code, early.json()["code"]) == (404, "KUBERNETES::POD_IP_NOT_AVAILABLE")
        sandbox = await Sandbox.create(SHELL_IMAGE, entrypoint=["sleep", "600"], connection_config=config)
        assert (await sandbox.get_info()).status.state == "Running"
        assert await sandbox.is_healthy()
        await sandbox.kill()
        await sandbox.close()


async def test_kubernetes_runtime_leaves_an_unknown_image_pending_until_it_expires(
    opensandbox_factory: OpenSandboxFactory,
) -> None:
    async with opensandbox_factory(runtime="kubernetes") as osb:
        manager = await SandboxManager.create(connection_config=sdk_config(osb))
        with pytest.raises(Exception, match=r"ready|timed out|Timeout"):
            await Sandbox.create(
                "registry.test/missing:1",
                entrypoint=["true"],
                ready_timeout=timedelta(seconds=0.5),
                connection_config=sdk_config(osb),
            )
        assert osb.listed() == []  # the SDK kills what did not get ready
        async with httpx.AsyncClient(base_url=osb.url, headers={"OPEN-SANDBOX-API-KEY": osb.api_key}) as client:
            created = await client.post(
                "/v1/sandboxes",
                json={
                    "image": {"uri": "registry.test/missing:1"},
                    "entrypoint": ["true"],
                    "resourceLimits": {},
                    "timeout": 60,
                },
            )
        await asyncio.sleep(0.2)
        sandbox_id = created.json()["id"]
        assert (await manager.get_sandbox_info(sandbox_id)).status.state == "Pending"
        assert await osb.advance(61) == [sandbox_id]
        await manager.close()


async def test_execd_is_unreachable_once_the_entrypoint_has_exited(opensandbox: OpenSandboxDouble) -> None:
    config = sdk_config(opensandbox)
    sandbox = await Sandbox.create(SHELL_IMAGE, entrypoint=["true"], skip_health_check=True, connection_config=config)
    await opensandbox.wait_for_state(sandbox.id, "Terminated")
    assert not await sandbox.is_healthy()
    with pytest.raises(SandboxApiException) as refused:
        await sandbox.files.write_file("/run/x", "y")
    assert refused.value.status_code == 502
    await sandbox.kill()
    await sandbox.close()


async def test_commands_run_inside_the_sandbox_and_report_their_exit(opensandbox: OpenSandboxDouble) -> None:
    from opensandbox.models.execd import RunCommandOpts

    config = sdk_config(opensandbox)
    sandbox = await Sandbox.create(
        SHELL_IMAGE, entrypoint=["sleep", "600"], env={"A": "from-create"}, connection_config=config
    )
    await sandbox.files.write_file("/run/seen", "inside\n")
    ok = await sandbox.commands.run(
        'cat /run/seen; echo "$A $B"; echo err >&2', opts=RunCommandOpts(envs={"B": "from-run"})
    )
    assert [m.text for m in ok.logs.stdout] == ["inside", "from-create from-run"]
    assert [m.text for m in ok.logs.stderr] == ["err"]
    assert ok.exit_code == 0 and ok.error is None
    failed = await sandbox.commands.run("exit 7")
    assert failed.exit_code == 7 and failed.error is not None and failed.error.name == "CommandExecError"
    slow = await sandbox.commands.run("sleep 30", opts=RunCommandOpts(timeout=timedelta(milliseconds=200)))
    assert slow.exit_code == -1
    await sandbox.kill()
    await sandbox.close()
