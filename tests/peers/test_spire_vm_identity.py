"""A `vm` pool's identity path against the real spire-server and spire-agent (SPIRE 1.13).

The controller (in this process, embedded NATS, the Gitea double) reaches the real server as a
production deployment does — over TCP with its admin X509-SVID (`admin_ids`), the server
verified by its SPIFFE ID — mints the VM's join token with the job's alias and makes the job's
entry. The OpenSandbox double boots the VM image's entrypoint (vm/entrypoint.sh), which starts
the real `spire-agent` with that token; the real executor waits for its SVID with py-spiffe,
and a step lists every SVID the Workload API gives it. After the job, the server has no
agent and no entry left. A token that is wrong, or that someone used first, fails the job
with the agent's reason. Only the sandbox is a double: SPIRE is real.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from dynrunner.controller.backends.opensandbox.backend import OpenSandboxBackend
from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.opensandbox import OpenSandboxDouble
from dynrunner.proto.spire import SpireServerClient
from tests.fixtures.harness import config_data, in_process, wait_run_done
from tests.fixtures.opensandbox import VM_IMAGE, vm_image
from tests.fixtures.opensandbox_backend import POOL
from tests.fixtures.real_spire import RealSpire

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB_ID = "spiffe://example.org/ci/owner/repo/build"
EXECUTOR_USER = "nobody"
EXECUTOR_UID = 65534
# A step lists every X509-SVID the VM's Workload API gives its uid, with SPIRE's own client.
WORKFLOW = """
on: push
jobs:
  build:
    runs-on: [self-hosted, vm]
    steps:
      - run: |
          {agent} api fetch x509 -socketPath /run/spire/agent/public/api.sock \\
            | sed -n 's/^SPIFFE ID:[[:space:]]*/svid: /p'
"""

# The agent command for a VM whose token goes wrong before the real agent starts: `wrong`
# overwrites it, `reused` lets another real agent attest with it first.
SPOILER = """#!/bin/sh
set -eu
conf=$2
token_file=$(sed -n 's/^ *join_token_file = "\\(.*\\)"/\\1/p' "$conf")
case "$SPOIL" in
wrong) printf 'not-a-token-of-this-server' >"$token_file" ;;
reused)
    sed -e 's|/run/spire/agent/public/api.sock|/run/thief.sock|' -e 's|data_dir = "\\(.*\\)"|data_dir = "\\1-thief"|' \\
        "$conf" >"$conf.thief"
    "$AGENT" run -config "$conf.thief" &
    thief=$!
    tries=300
    while [ ! -S /run/thief.sock ] && [ "$tries" -gt 0 ]; do sleep 0.1; tries=$((tries - 1)); done
    kill "$thief"; wait "$thief" || true
    ;;
esac
exec "$AGENT" run -config "$conf"
"""


@dataclass
class Seen:
    """What the real server held while a job ran (looked at every 100 ms)."""

    entries: set[tuple[str, str]] = field(default_factory=set)
    agents: set[str] = field(default_factory=set)
    rpcs: int = 0
    """Server API calls the controller made (its periodic leftovers sweep included)."""


async def server_state(spire: RealSpire) -> tuple[set[tuple[str, str]], set[str]]:
    """(SPIFFE ID, parent) of every entry, and every agent, through the Server API."""
    async with grpc.aio.insecure_channel(spire.admin_target) as channel:
        client = SpireServerClient(channel)
        entries = {(e.spiffe_id, e.parent_id) for e in await client.all_entries()}
    agents = set(await asyncio.to_thread(spire.agents))
    return entries, agents


@contextlib.asynccontextmanager
async def watching(spire: RealSpire) -> AsyncIterator[Seen]:
    seen = Seen()

    async def look() -> None:
        while True:
            with contextlib.suppress(Exception):
                entries, agents = await server_state(spire)
                seen.entries |= entries
                seen.agents |= agents
            await asyncio.sleep(0.1)

    task = asyncio.create_task(look())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def image_env(spire: RealSpire, state: Path, programs: Path, spoil: str = "") -> dict[str, str]:
    agent = str(spire.peer.binary("spire-agent"))
    env = {
        # The executor's user must be able to run it: this checkout's venv may lie where it
        # cannot (a clone in `mktemp -d`), the session's installation can (the VM has its own /run).
        "DYNRUNNER_EXECUTOR_COMMAND": str(programs / "dynrunner-executor"),
        "DYNRUNNER_SPIRE_AGENT_COMMAND": f"{agent} run",
        "SPIRE_SERVER_ADDRESS": "127.0.0.1",
        "SPIRE_SERVER_PORT": str(spire.port),
        "SPIRE_TRUST_DOMAIN": spire.trust_domain,
        "DYNRUNNER_SPIRE_AGENT_TIMEOUT_SECONDS": "15",
        "DYNRUNNER_EXECUTOR_USER": EXECUTOR_USER,
    }
    if spoil:
        script = state / "spoil-agent.sh"
        script.write_text(SPOILER)
        script.chmod(0o755)
        env |= {"DYNRUNNER_SPIRE_AGENT_COMMAND": str(script), "SPOIL": spoil, "AGENT": agent}
    return env


def controller_config(
    gitea: GiteaDouble, nats_url: str, osb: OpenSandboxDouble, spire: RealSpire, state: Path, workspace: Path
) -> Any:
    cert, key, bundle = spire.admin_svid()
    api_key = state / "opensandbox.key"
    api_key.write_text(osb.api_key)
    pool = {
        "name": POOL,
        "labels": ["self-hosted", "vm"],
        "maxConcurrency": 2,
        "backend": {
            "kind": "opensandbox",
            "url": osb.url,
            "apiKeyFile": str(api_key),
            "image": VM_IMAGE,
            "pollIntervalSeconds": 0.1,
            "startTimeoutSeconds": 60,
            "workspace": str(workspace),
            "executorUid": EXECUTOR_UID,
        },
    }
    data = config_data(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=state / "controller",
        nats_url=nats_url,
        pools=[pool],
    )
    data["identity"] = {
        "trustDomain": spire.trust_domain,
        "svidTimeoutSeconds": 60,
        "spireServer": {
            "address": spire.address,
            "certFile": str(cert),
            "keyFile": str(key),
            "bundleFile": str(bundle),
        },
    }
    return ControllerConfig.model_validate(data)


def executor_dirs(spire: RealSpire) -> tuple[Path, str]:
    """The executor runs as its own user (the entrypoint's setpriv, as in the image): its
    workspace is a directory of that user's, where it can reach it (pytest's is root's, 0700).
    The host's /root (the build cache) is closed to it: the step's spire-agent is a copy."""
    shared = Path(tempfile.mkdtemp(prefix="vm-job-"))
    shared.chmod(0o755)
    (shared / "work").mkdir()
    os.chown(shared / "work", EXECUTOR_UID, EXECUTOR_UID)
    return shared, shutil.copy(spire.peer.binary("spire-agent"), shared / "spire-agent")


async def run_vm_job(
    gitea: GiteaDouble, nats_url: str, spire: RealSpire, state: Path, programs: Path, spoil: str = ""
) -> tuple[Any, list[str], Seen, float]:
    images = {VM_IMAGE: vm_image(**image_env(spire, state, programs, spoil))}
    shared, agent = await asyncio.to_thread(executor_dirs, spire)
    workspace = shared / "work"
    async with OpenSandboxDouble.start(state / "opensandbox", images=images) as osb:
        cfg = controller_config(gitea, nats_url, osb, spire, state, workspace)
        backend = OpenSandboxBackend.from_config(cfg.pools[0], cfg, clock=osb.clock.now)
        async with watching(spire) as seen, in_process(cfg, backends={POOL: backend}):
            began = time.monotonic()
            run = gitea.submit("owner/repo", WORKFLOW.format(agent=agent))
            done = await wait_run_done(gitea, run.id, within=150)
            took = time.monotonic() - began

            async def nothing_left() -> bool:
                entries, agents = await server_state(spire)
                return not entries and not agents and not osb.listed()

            deadline = time.monotonic() + 30
            while not await nothing_left():
                assert time.monotonic() < deadline, f"left on the server: {await server_state(spire)}"
                await asyncio.sleep(0.2)
    shutil.rmtree(shared, ignore_errors=True)
    rows = gitea.task(done.jobs[0].task_id).log_rows
    assert backend.agents is not None
    seen.rpcs = backend.agents.sent
    return done, rows, seen, took


async def test_a_vm_job_gets_exactly_its_svid_from_the_real_spire_and_leaves_nothing(
    gitea: GiteaDouble, nats_url: str, real_spire: RealSpire, tmp_path: Path, programs_outside_run: Path
) -> None:
    done, rows, seen, took = await run_vm_job(gitea, nats_url, real_spire, tmp_path, programs_outside_run)
    assert done.status == "success", "\n".join(rows)
    issued = [row for row in rows if row.startswith(f"Workload identity {JOB_ID} issued after")]
    assert issued, rows[-30:]
    listed = [row.removeprefix("svid: ") for row in rows if row.startswith("svid: ")]
    assert listed == [JOB_ID], "exactly the job's SVID, nothing else"

    aliases = {(sid, parent) for sid, parent in seen.entries if "/dynrunner/agent/vm/" in sid}
    [(alias, token_agent)] = aliases
    assert token_agent.startswith("spiffe://example.org/spire/agent/join_token/")
    assert (JOB_ID, alias) in seen.entries, seen.entries
    assert seen.agents == {token_agent}, "one agent, the VM's, attested with the token"
    print(f"\nVM job with identity, submit to done: {took:.1f}s; {issued[0]}; {seen.rpcs} SPIRE Server RPCs")


@pytest.mark.parametrize("spoil", ["wrong", "reused"])
async def test_a_wrong_or_reused_token_fails_the_job_with_the_agents_reason(
    gitea: GiteaDouble, nats_url: str, real_spire: RealSpire, tmp_path: Path, programs_outside_run: Path, spoil: str
) -> None:
    done, rows, seen, _ = await run_vm_job(gitea, nats_url, real_spire, tmp_path, programs_outside_run, spoil)
    assert done.status == "failure", rows[-30:]
    text = "\n".join(rows)
    assert "The SPIRE agent in the VM did not come up" in text, rows[-30:]
    assert "join token does not exist or has already been used" in text, rows[-30:]
    assert not any(row.startswith("svid: ") for row in rows)
    if spoil == "reused":
        assert len(seen.agents) == 1, "the thief's agent attested, and was evicted with the job"
