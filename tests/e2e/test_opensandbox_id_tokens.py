"""OIDC ID tokens in microVMs, end to end: a `vm` pool with `refInSpiffeId`; the VM's own agent
(the join-token agent double) serves the Workload API; the real executor answers the real
`@actions/core` `getIDToken` with a JWT-SVID that a relying party, holding the JWKS the job's
agent publishes (`dynrunner-identity bundle`), accepts for that job, ref and audience only."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.clients import ActionClients
from tests.fixtures.harness import config_data, in_process, wait_run_done
from tests.fixtures.oidc import Refused, verify
from tests.fixtures.opensandbox_backend import VmWorld, vm_world

pytestmark = pytest.mark.slow

DEPLOY = "spiffe://example.org/ci/acme/widgets/deploy/refs/tags/v1.2.3"

WORKFLOW = """
on: push
jobs:
  deploy:
    runs-on: [self-hosted, vm]
    permissions: write-all
    steps:
      - shell: node {{0}}
        run: |
{node}
      - run: dynrunner-identity bundle > {out}/jwks.json
"""

NODE_STEP = """
const core = require(require.resolve('@actions/core', {paths: [CLIENTS]}));
core.getIDToken('sts.example').then((token) => {
  require('fs').writeFileSync(OUT + '/action.jwt', token);
  console.log(`careless: ${token}`);
}, (err) => core.setFailed(`no ID token: ${err.message}`));
"""


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[VmWorld]:
    (tmp_path / "vm").mkdir()
    async with vm_world(tmp_path / "vm") as made:
        yield made


async def test_a_vm_job_gets_tokens_of_its_own_ref_scoped_identity(
    gitea: GiteaDouble, nats_url: str, world: VmWorld, tmp_path: Path, action_clients: ActionClients
) -> None:
    data = config_data(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "state",
        nats_url=nats_url,
        pools=[{**world.pool(), "refInSpiffeId": True}],
    )
    data["identity"] = world.identity()
    out = tmp_path / "tokens"
    out.mkdir()
    head = f"const CLIENTS = {json.dumps(str(action_clients.root))};\nconst OUT = {json.dumps(str(out))};\n"
    node = "\n".join(f"          {line}" for line in (head + NODE_STEP).strip().splitlines())
    async with in_process(ControllerConfig.model_validate(data)):
        run = gitea.submit("acme/widgets", WORKFLOW.format(node=node, out=out), ref="refs/tags/v1.2.3")
        done = await wait_run_done(gitea, run.id, within=120)
    [job] = done.jobs
    log = gitea.task(job.task_id).log_rows
    assert job.status == "success", "\n".join(log)
    token, jwks = (out / "action.jwt").read_text(), (out / "jwks.json").read_bytes()
    assert verify(token, jwks, audience="sts.example", subject=DEPLOY)["sub"] == DEPLOY
    with pytest.raises(Refused, match="InvalidAudienceError"):
        verify(token, jwks, audience="vault.example", subject=DEPLOY)
    with pytest.raises(Refused, match="is not"):
        verify(token, jwks, audience="sts.example", subject=DEPLOY.replace("/tags/v1.2.3", "/heads/main"))
    assert f"OIDC ID tokens: on (the job's `permissions:` grant write-all); subject {DEPLOY}" in log
    assert "careless: ***" in log and not any(token in row for row in log)
