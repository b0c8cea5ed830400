"""The job's identity in the VM, as the backend arranges it: a join token minted with the job's
alias and delivered with the trust bundle; the VM's agent (the join-token agent double) attests
with it; the job's entry, which the backend registers parented on the alias with the executor's
uid, reaches the real executor, which waits for exactly its SPIFFE ID; deleting the environment
removes the agent, the alias and the job's entry."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from dynrunner.controller.backends.base import Phase, StartStage
from dynrunner.controller.backends.opensandbox import builders
from dynrunner.controller.backends.opensandbox.builders import agent_alias
from dynrunner.controller.backends.opensandbox.config import SpireServerConfig
from dynrunner.doubles.spire.server import SpireServer
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.opensandbox import VM_EXECUTOR_UID, VM_IMAGE, OpenSandboxFactory
from tests.fixtures.opensandbox_backend import (
    POOL,
    as_built_for,
    joining_vm_image,
    stand_in_image,
    vm_assignment,
    vm_backend,
)
from tests.fixtures.spire_server import TRUST_DOMAIN

JOB_ID = f"spiffe://{TRUST_DOMAIN}/ci/owner/repo/build"
WORKFLOW = """
on: push
jobs:
  build:
    runs-on: [self-hosted, vm]
    steps:
      - run: echo "the job ran with its identity"
"""


@pytest.mark.slow
async def test_the_job_gets_its_spiffe_id_from_the_agent_that_joined_with_the_delivered_token(
    spire_server: SpireServer,
    opensandbox_factory: OpenSandboxFactory,
    executor_harness: ExecutorHarness,
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(spire_server.bundle_pem)
    spire = SpireServerConfig(socket_path=spire_server.socket_path, bundle_file=bundle, join_token_ttl_s=120)
    claimed = await executor_harness.claim(WORKFLOW, labels=("self-hosted", "vm"), spiffe_id=JOB_ID)
    alias = agent_alias(TRUST_DOMAIN, POOL, claimed.assignment.assignment_id)

    async with (
        opensandbox_factory(images={VM_IMAGE: joining_vm_image(spire_server)}) as osb,
        vm_backend(osb, tmp_path, spire=spire, identity=True, executor_uid=VM_EXECUTOR_UID) as backend,
    ):
        config = backend.settings.backend
        assignment = as_built_for(dataclasses.replace(claimed.assignment, pool=POOL), config)
        env = await backend.create(assignment)
        [entry] = [e for e in spire_server.state.entries.entries() if e.spiffe_id == JOB_ID]
        assert entry.parent_id == alias and entry.selectors == frozenset({("unix", f"uid:{VM_EXECUTOR_UID}")})
        [box] = osb.listed()
        partial = box.rootfs / "run/dynrunner/delivery.partial"
        assert sorted(p.name for p in partial.iterdir()) == ["assignment.pb", "bundle.pem", "join-token"]
        token = (partial / "join-token").read_text()
        assert token not in str(box.metadata) and token not in str(box.env)
        assert (partial / "bundle.pem").read_bytes() == spire_server.bundle_pem

        events = [e async for e in backend.follow_start(env)]
        assert events[-1].stage is StartStage.STARTED
        await osb.wait_for_state(box.id, "Terminated", "Failed", timeout_s=60)
        console = box.console.read_text()
        assert (await backend.observe(env)).phase is Phase.SUCCEEDED, console
        task = executor_harness.gitea.task(claimed.task_id)
        assert task.result == Result.SUCCESS, task.log_rows
        assert "the job ran with its identity" in task.log_rows
        agent = f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/{token}"
        assert spire_server.agent_ids() == [agent]
        assert not (box.rootfs / "run/dynrunner/delivery/join-token").exists()

        await backend.delete(env)
        assert spire_server.agent_ids() == []
        assert [e for e in spire_server.state.entries.entries() if alias in (e.spiffe_id, e.parent_id)] == []


async def test_two_controllers_staging_one_vm_leave_one_usable_join_token(
    spire_server: SpireServer, opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """Staging is exclusive: each controller writes its delivery into a directory of its own and
    renames it to `delivery.partial`, which execd lets one of them do; the other withdraws its
    files and its token's alias entry, so no second token can give anyone the job's identity."""
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(spire_server.bundle_pem)
    spire = SpireServerConfig(socket_path=spire_server.socket_path, bundle_file=bundle)
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, "sleep 600\n")}) as osb,
        vm_backend(osb, tmp_path, spire=spire, identity=True) as one,
        vm_backend(osb, tmp_path, spire=spire, identity=True) as other,
    ):
        a = vm_assignment()
        await one.api.create(builders.sandbox_request(a, one.settings, now=osb.clock.now()))
        envs = await asyncio.gather(one.create(a), other.create(a))
        [box] = osb.listed()
        assert {env.extra["sandbox"] for env in envs} == {box.id}
        assert box.metadata["dynrunner-stage"] == "staged"
        run = box.rootfs / "run/dynrunner"
        token = (run / "delivery.partial/join-token").read_text()
        alias = agent_alias(TRUST_DOMAIN, POOL, a.assignment_id)
        usable = [e.parent_id for e in spire_server.state.entries.entries() if e.spiffe_id == alias]
        assert usable == [f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/{token}"]
        left = [p for p in run.rglob("*") if p.is_file() and "delivery.partial/" not in str(p)]
        assert left == []
