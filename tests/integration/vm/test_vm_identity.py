"""Identity in the VM end to end: the SPIRE Server API double mints a join token, the VM's
entrypoint (booted by the OpenSandbox double) starts the join-token agent double with it, the
job's entry is parented on that agent with a unix:uid selector, and the real executor waits
for exactly its SPIFFE ID before running the job."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import grpc
import pytest
from opensandbox import Sandbox

from dynrunner.doubles.spire._gen.api.server.agent.v1 import agent_pb2
from dynrunner.doubles.spire._gen.api.server.entry.v1 import entry_pb2
from dynrunner.doubles.spire._gen.api.types import types_pb2 as types
from dynrunner.doubles.spire.server import SpireServer
from dynrunner.doubles.spire.server_api import to_proto_id
from dynrunner.proto.assignment import IdentityWait, encode
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.opensandbox import ENTRYPOINT, VM_IMAGE, OpenSandboxFactory, deliver, sdk_config, vm_image
from tests.fixtures.spire_server import TRUST_DOMAIN, spire_admin

SOCKET = "/run/spire/agent/public/api.sock"
JOB_ID = f"spiffe://{TRUST_DOMAIN}/ci/owner/repo/build"
WORKFLOW = """
on: push
jobs:
  build:
    runs-on: [self-hosted, vm]
    steps:
      - run: echo "the job ran"
"""


def _vm_image(spire: SpireServer) -> object:
    return vm_image(
        DYNRUNNER_SPIRE_AGENT_COMMAND=f"dynrunner-spire-agent-double run --server-mtls-port {spire.port}",
        SPIRE_SERVER_ADDRESS="localhost",
        SPIRE_SERVER_PORT=str(spire.attest_port),
        SPIRE_TRUST_DOMAIN=TRUST_DOMAIN,
    )


async def _run_job(
    spire_server: SpireServer,
    opensandbox_factory: OpenSandboxFactory,
    executor_harness: ExecutorHarness,
    *,
    entry_parent: str | None,
    timeout_s: int,
) -> tuple[int, str, str]:
    """Mint a token, register the job's entry under `entry_parent` (None: under this VM's
    agent), run the job in a VM; returns (task id, sandbox state, console)."""
    admin = spire_admin(spire_server)
    token = await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=600))
    agent_id = f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/{token.value}"
    created = await admin.entry.BatchCreateEntry(
        entry_pb2.BatchCreateEntryRequest(
            entries=[
                types.Entry(
                    spiffe_id=to_proto_id(JOB_ID),
                    parent_id=to_proto_id(entry_parent or agent_id),
                    selectors=[types.Selector(type="unix", value="uid:0")],
                )
            ]
        )
    )
    assert created.results[0].status.code == 0
    claimed = await executor_harness.claim(WORKFLOW, labels=("self-hosted", "vm"), spiffe_id=JOB_ID)
    assignment = dataclasses.replace(
        claimed.assignment,
        executor=dataclasses.replace(
            claimed.assignment.executor,
            workspace="/run/dynrunner/work",
            identity=IdentityWait(enabled=True, workload_api_socket=SOCKET, timeout_seconds=timeout_s),
        ),
    )
    async with opensandbox_factory(images={VM_IMAGE: _vm_image(spire_server)}) as osb:
        sandbox = await Sandbox.create(
            VM_IMAGE, entrypoint=[ENTRYPOINT], timeout=timedelta(minutes=10), connection_config=sdk_config(osb)
        )
        await deliver(
            sandbox,
            {
                "assignment.pb": encode(assignment),
                "join-token": token.value.encode(),
                "bundle.pem": spire_server.bundle_pem,
            },
        )
        box = await osb.wait_for_state(sandbox.id, "Terminated", "Failed", timeout_s=60)
        state, console = box.status.state, box.console.read_text()
        assert not (box.rootfs / "run/dynrunner/delivery/join-token").exists(), "the token file outlives attestation"
        await sandbox.kill()
        await sandbox.close()
    await admin.channel.close()
    return claimed.task_id, state, console


@pytest.mark.slow
async def test_the_job_gets_its_spiffe_id_from_the_vms_join_token_agent(
    spire_server: SpireServer, opensandbox_factory: OpenSandboxFactory, executor_harness: ExecutorHarness
) -> None:
    task_id, state, console = await _run_job(
        spire_server, opensandbox_factory, executor_harness, entry_parent=None, timeout_s=30
    )
    task = executor_harness.gitea.task(task_id)
    assert state == "Terminated", console
    assert task.result == Result.SUCCESS, task.log_rows
    assert "the job ran" in task.log_rows
    (agent_id,) = spire_server.agent_ids()
    assert "attested as " + agent_id in console
    admin = spire_admin(spire_server)
    listed = await admin.agent.ListAgents(agent_pb2.ListAgentsRequest())
    assert [(a.attestation_type, a.can_reattest) for a in listed.agents] == [("join_token", False)]
    await admin.agent.DeleteAgent(agent_pb2.DeleteAgentRequest(id=to_proto_id(agent_id)))
    assert spire_server.agent_ids() == []
    await admin.channel.close()


@pytest.mark.slow
async def test_an_entry_parented_on_another_agent_gives_the_job_no_identity(
    spire_server: SpireServer, opensandbox_factory: OpenSandboxFactory, executor_harness: ExecutorHarness
) -> None:
    other = f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/someone-else"
    task_id, state, console = await _run_job(
        spire_server, opensandbox_factory, executor_harness, entry_parent=other, timeout_s=2
    )
    task = executor_harness.gitea.task(task_id)
    assert state == "Terminated", console  # the executor finalized the task: exit 0
    assert task.result == Result.FAILURE
    assert any(f"workload identity {JOB_ID} not issued within 2s" in row for row in task.log_rows), task.log_rows


async def test_a_used_join_token_cannot_attest_again(spire_server: SpireServer) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    from dynrunner.doubles.spire.vm_agent import attest

    admin = spire_admin(spire_server)
    token = await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60))
    key = ec.generate_private_key(ec.SECP256R1())
    await attest(spire_server.attest_address, spire_server.bundle_pem, token.value, key)
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await attest(spire_server.attest_address, spire_server.bundle_pem, token.value, key)
    assert again.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not exist or has already been used" in (again.value.details() or "")
    await admin.channel.close()
