"""OIDC ID tokens from the real SPIRE: a real `spire-server` (with `jwt_issuer`) and a real
join-token `spire-agent` on the host, an entry for this uid with the job's SPIFFE ID, the real
executor answering the real `@actions/core` `getIDToken('sts.example')` with the agent's
JWT-SVID, and SPIRE's real `oidc-discovery-provider` (reading the server's API) publishing the
keys a relying party verifies it with: that audience, issuer and job only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from dynrunner.proto.assignment import IdentityWait
from dynrunner.proto.gitea import Result
from tests.fixtures.clients import ActionClients
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.oidc import Refused, id_token_action, verify
from tests.fixtures.real_spire import TRUST_DOMAIN, running_spire, short_tmp, spire_peer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ISSUER = "https://oidc.example.org"
DEPLOY = f"spiffe://{TRUST_DOMAIN}/ci/owner/repo/deploy/refs/heads/main"
WORKFLOW = """
on: push
jobs:
  deploy:
    runs-on: self-hosted
    permissions:
      id-token: write
    steps:
      - uses: ./idtoken
        with:
          audience: sts.example
          out: {out}
"""


def get(port: int, path: str) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": "localhost"})
    with urllib.request.urlopen(request, timeout=2) as response:
        return bytes(response.read())


def wait_for_keys(port: int, proc: subprocess.Popen[bytes]) -> bytes:
    deadline = time.monotonic() + 30
    while True:
        try:
            keys = get(port, "/keys")
            if json.loads(keys).get("keys"):
                return keys
        except OSError:
            pass
        assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
        assert time.monotonic() < deadline, "the provider served no keys within 30s"
        time.sleep(0.2)


async def test_the_real_agent_issues_the_tokens_and_the_real_provider_serves_their_keys(
    executor_harness: ExecutorHarness, action_clients: ActionClients, tmp_path: Path, reserved_port: int
) -> None:
    peer = spire_peer()
    provider = peer.binary("oidc-discovery-provider")
    if not provider.is_file():
        pytest.skip(f"the SPIRE build in {peer.path} has no oidc-discovery-provider: run `make peers`")
    sockets = short_tmp()
    try:
        with running_spire(peer, jwt_issuer=ISSUER) as spire:
            join = spire.cli("token", "generate", "-ttl", "600").split()[1]  # "Token: <token>\nWarning: …"
            with spire.agent(join, sockets / "agent") as agent:
                spire.cli(
                    "entry",
                    "create",
                    "-parentID",
                    f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/{join}",
                    "-spiffeID",
                    DEPLOY,
                    "-selector",
                    f"unix:uid:{os.getuid()}",
                )
                config = tmp_path / "oidc-discovery-provider.conf"
                config.write_text(
                    f'log_level = "debug"\ndomains = ["localhost"]\ninsecure_addr = "127.0.0.1:{reserved_port}"\n'
                    f'allow_insecure_scheme = true\njwt_issuer = "{ISSUER}"\n'
                    f'server_api {{\n  address = "unix://{spire.socket_path}"\n  poll_interval = "1s"\n}}\n'
                )
                proc = subprocess.Popen(  # noqa: ASYNC220 - a server for the test's whole life
                    [str(provider), "-config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
                try:
                    identity = IdentityWait(
                        enabled=True, workload_api_socket=str(agent.socket_path), timeout_seconds=60
                    )
                    out = tmp_path / "token.jwt"
                    started = time.monotonic()
                    task = await executor_harness.run_job(
                        WORKFLOW.format(out=out),
                        identity=identity,
                        spiffe_id=DEPLOY,
                        files=id_token_action(action_clients.root),
                    )
                    took = time.monotonic() - started
                    keys = wait_for_keys(reserved_port, proc)
                    discovery = json.loads(get(reserved_port, "/.well-known/openid-configuration"))
                finally:
                    proc.terminate()
                    proc.communicate(timeout=10)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    assert task.result == Result.SUCCESS, "\n".join(task.log_rows)
    token = out.read_text()
    assert discovery["issuer"] == ISSUER
    claims = verify(token, keys, audience="sts.example", subject=DEPLOY, issuer=ISSUER)
    assert claims["sub"] == DEPLOY
    assert 0 < claims["exp"] - claims["iat"] <= 300, "SPIRE's default_jwt_svid_ttl"
    with pytest.raises(Refused, match="InvalidAudienceError"):
        verify(token, keys, audience="vault.example", subject=DEPLOY, issuer=ISSUER)
    with pytest.raises(Refused, match="is not"):
        verify(token, keys, audience="sts.example", subject=DEPLOY.replace("/main", "/dev"), issuer=ISSUER)
    assert not any(token in row for row in task.log_rows)
    print(f"job with the real agent's ID token: {took:.1f}s (identity wait included)")
