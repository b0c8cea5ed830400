"""OIDC ID tokens in Pods, end to end: the controller claims from the Gitea double and runs
each job as a Pod of the Kubernetes double, whose SPIRE double issues the job's identity (with
the pool's `refInSpiffeId`, the ref is in it); the real executor serves `getIDToken` of the real
`@actions/core`, and `dynrunner-identity`, with JWT-SVIDs a relying party accepts for that job,
ref and audience only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.kubernetes.cluster import Cluster
from tests.fixtures.clients import ActionClients
from tests.fixtures.harness import in_process, wait_run_done
from tests.fixtures.kubernetes_backend import kube_controller_data
from tests.fixtures.oidc import Refused, verify

DEPLOY = "spiffe://example.org/ci/acme/widgets/deploy/refs/heads/main"

NODE_STEP = """
const core = require(require.resolve('@actions/core', {paths: [CLIENTS]}));
const fs = require('fs');
core.getIDToken('sts.example').then((token) => {
  fs.writeFileSync(OUT + '/action.jwt', token);
  console.log(`careless: ${token}`);
}, (err) => core.setFailed(`no ID token: ${err.message}`));
"""

WORKFLOW = """
on: push
permissions:
  contents: read
jobs:
  deploy:
    runs-on: [self-hosted, local]
    permissions:
      id-token: write
    steps:
      - shell: node {{0}}
        run: |
{node}
      - run: dynrunner-identity jwt --audience vault.example > {out}/cli.jwt
  build:
    runs-on: [self-hosted, local]
    steps:
      - run: echo "url=[$ACTIONS_ID_TOKEN_REQUEST_URL]"
"""


async def test_pod_jobs_get_tokens_of_their_own_ref_scoped_identity(
    gitea: GiteaDouble, nats_url: str, executor_cluster: Cluster, tmp_path: Path, action_clients: ActionClients
) -> None:
    kubeconfig = executor_cluster.api.write_kubeconfig(tmp_path / "kubeconfig")
    data = kube_controller_data(gitea.url, gitea.registration_token, nats_url, kubeconfig, tmp_path / "state")
    data["pools"][0]["refInSpiffeId"] = True
    cfg = ControllerConfig.model_validate(data)
    out = tmp_path / "tokens"
    out.mkdir()
    head = f"const CLIENTS = {json.dumps(str(action_clients.root))};\nconst OUT = {json.dumps(str(out))};\n"
    node = "\n".join(f"          {line}" for line in (head + NODE_STEP).strip().splitlines())
    async with in_process(cfg):
        run = gitea.submit("acme/widgets", WORKFLOW.format(node=node, out=out), ref="refs/heads/main")
        done = await wait_run_done(gitea, run.id, within=120)
    logs = {job.name: gitea.task(job.task_id).log_rows for job in done.jobs}
    assert {job.name: job.status for job in done.jobs} == {"deploy": "success", "build": "success"}, logs
    jwks = executor_cluster.spire.jwt.jwks_bytes()
    action_token, cli_token = (out / "action.jwt").read_text(), (out / "cli.jwt").read_text().strip()

    assert verify(action_token, jwks, audience="sts.example", subject=DEPLOY)["sub"] == DEPLOY
    assert verify(cli_token, jwks, audience="vault.example", subject=DEPLOY)["sub"] == DEPLOY
    with pytest.raises(Refused, match="InvalidAudienceError"):
        verify(action_token, jwks, audience="vault.example", subject=DEPLOY)
    with pytest.raises(Refused, match="is not"):  # a policy for another ref refuses it
        verify(action_token, jwks, audience="sts.example", subject=DEPLOY.replace("/main", "/release"))

    deploy, build = logs["deploy"], logs["build"]
    assert f"OIDC ID tokens: on (the job's `permissions:` grant id-token: write); subject {DEPLOY}" in deploy
    assert "careless: ***" in deploy
    assert not any(action_token in row or cli_token in row for row in deploy + build)
    assert any(row.startswith(f"Workload identity {DEPLOY} issued after ") for row in deploy)
    build_id = "spiffe://example.org/ci/acme/widgets/build/refs/heads/main"
    assert any(row.startswith(f"Workload identity {build_id} issued after ") for row in build)
    assert "OIDC ID tokens: off (the workflow's `permissions:` set id-token: not granted" in "\n".join(build)
    assert "url=[]" in build
