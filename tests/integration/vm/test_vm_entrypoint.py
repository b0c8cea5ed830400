"""vm/entrypoint.sh booted by the OpenSandbox double: the delivery through execd's file API,
then the real executor running the job against the Gitea double."""

from __future__ import annotations

import base64
import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest
from opensandbox import Sandbox

from dynrunner.controller.backends.opensandbox.builders import STATE_MARKER
from dynrunner.controller.backends.opensandbox.diagnosis import accepted_state
from dynrunner.proto.assignment import encode
from dynrunner.proto.gitea import Result, StepState, TaskState
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.opensandbox import ENTRYPOINT, VM_IMAGE, OpenSandboxFactory, deliver, sdk_config, vm_image
from tests.fixtures.opensandbox_backend import stand_in_image
from tests.fixtures.privileges import needs_root

WORKFLOW = """
on: push
jobs:
  build:
    runs-on: [self-hosted, vm]
    steps:
      - run: echo "hello from $(cat /proc/1/comm 2>/dev/null || echo the vm)"
      - run: test -d /run/dynrunner/delivery && echo delivered
"""


@pytest.mark.slow
async def test_the_entrypoint_runs_the_delivered_assignment_to_the_end(
    opensandbox_factory: OpenSandboxFactory, executor_harness: ExecutorHarness
) -> None:
    claimed = await executor_harness.claim(WORKFLOW, labels=("self-hosted", "vm"))
    assignment = dataclasses.replace(
        claimed.assignment, executor=dataclasses.replace(claimed.assignment.executor, workspace="/run/dynrunner/work")
    )
    async with opensandbox_factory(images={VM_IMAGE: vm_image()}) as osb:
        sandbox = await Sandbox.create(
            VM_IMAGE,
            entrypoint=[ENTRYPOINT],
            metadata={"dynrunner-task-id": str(claimed.task_id)},
            timeout=timedelta(minutes=10),
            connection_config=sdk_config(osb),
        )
        await deliver(sandbox, {"assignment.pb": encode(assignment)})
        box = await osb.wait_for_state(sandbox.id, "Terminated", "Failed", timeout_s=60)
        console = box.console.read_text()
        assert box.status.state == "Terminated", console
        await sandbox.kill()
        await sandbox.close()
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS, task.log_rows
    assert "delivered" in task.log_rows


async def test_without_a_delivery_the_entrypoint_fails_the_sandbox(opensandbox_factory: OpenSandboxFactory) -> None:
    async with opensandbox_factory(images={VM_IMAGE: vm_image(DYNRUNNER_DELIVERY_TIMEOUT_SECONDS="1")}) as osb:
        sandbox = await Sandbox.create(
            VM_IMAGE, entrypoint=[ENTRYPOINT], skip_health_check=True, connection_config=sdk_config(osb)
        )
        box = await osb.wait_for_state(sandbox.id, "Terminated", "Failed")
        assert (box.status.state, box.status.message) == ("Failed", "Sandbox container exited with code 66.")
        assert "no assignment was delivered to /run/dynrunner/delivery within 1s" in box.console.read_text()
        await sandbox.kill()
        await sandbox.close()


# An agent that opens the Workload API socket named in its config and dies of SIGTERM
# (status 143), as any process without a handler does.
PLAIN_AGENT = """#!/bin/sh
sock=$(sed -n 's/.*socket_path = "\\(.*\\)"/\\1/p' "$2")
exec python3 -c 'import socket, sys, time; socket.socket(socket.AF_UNIX).bind(sys.argv[1]); time.sleep(600)' "$sock"
"""


async def test_the_sandbox_ends_with_the_executors_status_not_the_agents(
    opensandbox_factory: OpenSandboxFactory, executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    claimed = await executor_harness.claim(WORKFLOW, labels=("self-hosted", "vm"))
    assignment = dataclasses.replace(
        claimed.assignment, executor=dataclasses.replace(claimed.assignment.executor, workspace="/run/dynrunner/work")
    )
    agent = tmp_path / "plain-agent"
    agent.write_text(PLAIN_AGENT)
    agent.chmod(0o755)
    base = vm_image(DYNRUNNER_SPIRE_AGENT_COMMAND="{rootfs}/usr/local/bin/plain-agent")
    image = dataclasses.replace(base, files={**base.files, "/usr/local/bin/plain-agent": agent})
    async with opensandbox_factory(images={VM_IMAGE: image}) as osb:
        sandbox = await Sandbox.create(VM_IMAGE, entrypoint=[ENTRYPOINT], connection_config=sdk_config(osb))
        await deliver(sandbox, {"assignment.pb": encode(assignment), "join-token": b"t0k3n", "bundle.pem": b""})
        box = await osb.wait_for_state(sandbox.id, "Terminated", "Failed", timeout_s=60)
        assert (box.status.state, box.status.message) == ("Terminated", "Sandbox container exited successfully."), (
            box.console.read_text()
        )
        await sandbox.kill()
        await sandbox.close()
    assert executor_harness.gitea.task(claimed.task_id).result == Result.SUCCESS


# The real spire-agent 1.13 on a refused join token: it logs the refusal and retries forever.
RETRYING_AGENT = """#!/bin/sh
echo 'level=error msg="Agent crashed" error="failed to attest: join token does not exist or has already been used"'
exec sleep 600
"""
EXITING_AGENT = """#!/bin/sh
echo 'no server here' >&2
exit 1
"""


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (RETRYING_AGENT, "the SPIRE server refused the join token"),
        (EXITING_AGENT, "the SPIRE agent exited before it opened"),
    ],
)
async def test_an_agent_that_cannot_attest_fails_the_sandbox_at_once_with_its_lines(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path, script: str, reason: str
) -> None:
    agent = tmp_path / "agent"
    agent.write_text(script)
    agent.chmod(0o755)
    base = vm_image(DYNRUNNER_SPIRE_AGENT_COMMAND="{rootfs}/usr/local/bin/agent")  # the default 120 s wait
    image = dataclasses.replace(base, files={**base.files, "/usr/local/bin/agent": agent})
    async with opensandbox_factory(images={VM_IMAGE: image}) as osb:
        sandbox = await Sandbox.create(
            VM_IMAGE, entrypoint=[ENTRYPOINT], skip_health_check=True, connection_config=sdk_config(osb)
        )
        await deliver(sandbox, {"assignment.pb": b"", "join-token": b"t0k3n", "bundle.pem": b""})
        box = await osb.wait_for_state(sandbox.id, "Terminated", "Failed", timeout_s=60)
        console = box.console.read_text()
        assert (box.status.state, box.status.message) == ("Failed", "Sandbox container exited with code 69."), console
        assert reason in console
        assert ("join token does not exist" in console) == (script is RETRYING_AGENT), console
        assert ("no server here" in console) == (script is EXITING_AGENT), console
        await sandbox.kill()
        await sandbox.close()


KEPT = TaskState(7, steps=[StepState(0, Result.SUCCESS, log_index=0, log_length=2), StepState(1, Result.UNSPECIFIED)])


@pytest.mark.parametrize(
    ("ending", "limit", "printed"),
    [
        ("kill -9 $$", "12000", True),  # killed: the state is printed
        ("exit 3", "12000", True),  # failed without finalizing
        ("exit 0", "12000", False),  # finalized: Gitea has it all
        ("kill -9 $$", "8", False),  # too long for one console line: said instead
        ("kill -9 $$", "8x", True),  # not a number: the default
    ],
)
async def test_an_executor_that_did_not_finalize_leaves_its_accepted_state_on_the_console(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path, ending: str, limit: str, printed: bool
) -> None:
    """Issue 18 item 7: execd ends with the VM, so the entrypoint prints the state file on the
    console (base64, one line, the last), where the controller reads it after the VM ended."""
    source = tmp_path / "kept.pb"
    source.write_bytes(KEPT.encode())
    body = f'cp {source} "$DYNRUNNER_STATE_FILE"\n{ending}\n'
    image = stand_in_image(tmp_path, body, DYNRUNNER_STATE_CONSOLE_MAX_BYTES=limit)
    async with opensandbox_factory(images={VM_IMAGE: image}) as osb:
        sandbox = await Sandbox.create(VM_IMAGE, entrypoint=[ENTRYPOINT], connection_config=sdk_config(osb))
        await deliver(sandbox, {"assignment.pb": b"an assignment"})
        box = await osb.wait_for_state(sandbox.id, "Terminated", "Failed", timeout_s=60)
        console = box.console.read_text()
        await sandbox.kill()
        await sandbox.close()
    if printed:
        assert console.splitlines()[-1] == STATE_MARKER + base64.b64encode(KEPT.encode()).decode(), console
        assert accepted_state(console) == KEPT
    else:
        assert STATE_MARKER not in console, console
    assert ("is over 8 bytes: not printed" in console) is (limit == "8"), console


@needs_root("the entrypoint switches to the executor's user only as root")
@pytest.mark.parametrize(
    ("state", "printed"), [("cp /run/kept.pb", True), ("ln -s /run/dynrunner/delivery/secret", False)]
)
async def test_the_entrypoint_reads_the_state_file_as_the_executors_user(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path, state: str, printed: bool
) -> None:
    """The file is the job's (its directory is the executor user's): a job that links it to a
    file only root may read (here a delivered one, mode 600) gets nothing of it printed."""
    kept, stand_in = tmp_path / "kept.pb", tmp_path / "stand-in"
    kept.write_bytes(KEPT.encode())
    stand_in.write_text(f'#!/bin/sh\n{state} "$DYNRUNNER_STATE_FILE"\nkill -9 $$\n')
    stand_in.chmod(0o755)
    base = vm_image(DYNRUNNER_EXECUTOR_USER="nobody", DYNRUNNER_EXECUTOR_COMMAND="/run/stand-in")
    # Under /run, which the sandbox mounts from its rootfs: the test's directory is root's alone.
    image = dataclasses.replace(base, files={**base.files, "/run/stand-in": stand_in, "/run/kept.pb": kept})
    secret = b"only root reads this"
    async with opensandbox_factory(images={VM_IMAGE: image}) as osb:
        sandbox = await Sandbox.create(VM_IMAGE, entrypoint=[ENTRYPOINT], connection_config=sdk_config(osb))
        await deliver(sandbox, {"assignment.pb": b"an assignment", "secret": secret})
        box = await osb.wait_for_state(sandbox.id, "Terminated", "Failed", timeout_s=60)
        console, message = box.console.read_text(), box.status.message
        await sandbox.kill()
        await sandbox.close()
    assert message == "Sandbox container exited with code 137.", console
    assert (accepted_state(console) == KEPT) is printed, console
    assert base64.b64encode(secret).decode()[:12] not in console and (STATE_MARKER in console) is printed, console
