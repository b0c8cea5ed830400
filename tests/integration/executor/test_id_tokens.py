"""OIDC ID tokens end to end in the executor: a Node action on the real `@actions/core` asks
`getIDToken('sts.example')` of a job with a workload identity (Workload API double over a unix
socket, real JWT-SVIDs); a relying party accepts the token for that audience and that job's
SPIFFE ID only; jobs without `id-token: write` get no token; no token reaches the job log."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dynrunner.proto.assignment import IdentityWait
from dynrunner.proto.gitea import Result
from tests.fixtures.clients import ActionClients
from tests.fixtures.executor import ExecutorHarness, rows_of
from tests.fixtures.oidc import Refused, id_token_action, jwt_bundle, verify
from tests.fixtures.workload_api import workload_api

DEPLOY = "spiffe://example.org/ci/owner/repo/deploy"
BUILD = "spiffe://example.org/ci/owner/repo/build"
ISSUER = "https://oidc.example.org"

WORKFLOW = """
on: push
permissions:
  contents: read
jobs:
  {job}:
    runs-on: self-hosted
{permissions}
    steps:
      - id: ask
        uses: ./idtoken
        with:
          audience: sts.example
          out: {out}
      - run: |
          echo "url set: ${{ACTIONS_ID_TOKEN_REQUEST_URL:+true}}"
          echo "bearer: $ACTIONS_ID_TOKEN_REQUEST_TOKEN"
          echo "length: ${{{{ steps.ask.outputs.length }}}}"
"""
GRANT = "    permissions:\n      id-token: write"


@pytest.fixture
def socket() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="oidc-") as directory:  # unix socket paths are short
        yield Path(directory) / "agent.sock"


def workflow(job: str, out: Path, *, granted: bool) -> str:
    return WORKFLOW.format(job=job, permissions=GRANT if granted else "", out=out)


async def test_a_node_action_gets_a_token_only_its_job_and_audience_accept(
    executor_harness: ExecutorHarness, action_clients: ActionClients, socket: Path, tmp_path: Path
) -> None:
    identity = IdentityWait(enabled=True, workload_api_socket=str(socket), timeout_seconds=10)
    files = id_token_action(action_clients.root)
    with workload_api(socket, [DEPLOY, BUILD], issuer=ISSUER) as api:
        deploy_out, build_out = tmp_path / "deploy.jwt", tmp_path / "build.jwt"
        started = time.monotonic()
        deploy = await executor_harness.run_job(
            workflow("deploy", deploy_out, granted=True), identity=identity, spiffe_id=DEPLOY, files=files
        )
        took = time.monotonic() - started
        api.jwt.ttl_s = 2  # the other job's token is short-lived, to prove expiry is enforced
        build = await executor_harness.run_job(
            workflow("build", build_out, granted=True), identity=identity, spiffe_id=BUILD, files=files
        )
        jwks = jwt_bundle(socket, "example.org")
    assert deploy.result == Result.SUCCESS, deploy.log_rows
    assert build.result == Result.SUCCESS, build.log_rows
    token, other = deploy_out.read_text(), build_out.read_text()
    # Each executor asked the Workload API for its own identity, for the audience the step named.
    assert api.jwt_requests == [(DEPLOY, ("sts.example",)), (BUILD, ("sts.example",))]

    claims = verify(token, jwks, audience="sts.example", subject=DEPLOY, issuer=ISSUER)
    assert claims["sub"] == DEPLOY and claims["aud"] == "sts.example" and claims["iss"] == ISSUER
    with pytest.raises(Refused, match="InvalidIssuerError"):
        verify(
            token, jwks, audience="sts.example", subject=DEPLOY, issuer="https://token.actions.githubusercontent.com"
        )
    assert 0 < claims["exp"] - claims["iat"] <= 300
    with pytest.raises(Refused, match="InvalidAudienceError"):
        verify(token, jwks, audience="vault.example", subject=DEPLOY)
    with pytest.raises(Refused, match=f"subject {BUILD} is not {DEPLOY}"):
        verify(other, jwks, audience="sts.example", subject=DEPLOY)
    stranger = ec.generate_private_key(ec.SECP256R1())
    kid = jwt.get_unverified_header(token)["kid"]
    forged = jwt.encode(claims, stranger, algorithm="ES256", headers={"kid": kid})  # the right kid, another key
    with pytest.raises(Refused, match="InvalidSignatureError"):
        verify(forged, jwks, audience="sts.example", subject=DEPLOY)
    await asyncio.sleep(max(0.0, jwt.decode(other, options={"verify_signature": False})["exp"] + 1 - time.time()))
    with pytest.raises(Refused, match="ExpiredSignatureError"):
        verify(other, jwks, audience="sts.example", subject=BUILD)

    # The log shows that a token was issued, never the token or the request bearer.
    for task, value in ((deploy, token), (build, other)):
        assert not any(value in row for row in task.log_rows)
        assert "a careless step prints its token: ***" in rows_of(task, 0)
        second = rows_of(task, 1)
        assert "url set: true" in second and "bearer: ***" in second and f"length: {len(value)}" in second
    assert f"OIDC ID tokens: on (the job's `permissions:` grant id-token: write); subject {DEPLOY}" in deploy.log_rows
    assert any(
        row.startswith(f"Issued an OIDC ID token (JWT-SVID for {DEPLOY}) for audience 'sts.example', valid for ")
        for row in deploy.log_rows
    )
    print(f"job with an ID token: {took:.2f}s")


async def test_a_job_without_id_token_write_gets_no_token(
    executor_harness: ExecutorHarness, action_clients: ActionClients, socket: Path, tmp_path: Path
) -> None:
    """The workflow's `permissions:` (contents: read) hold no id-token: no variables, and the
    toolkit's own error names the missing variable; the log says why."""
    identity = IdentityWait(enabled=True, workload_api_socket=str(socket), timeout_seconds=10)
    out = tmp_path / "none.jwt"
    with workload_api(socket, [DEPLOY]) as api:
        task = await executor_harness.run_job(
            workflow("deploy", out, granted=False),
            identity=identity,
            spiffe_id=DEPLOY,
            files=id_token_action(action_clients.root),
        )
    assert task.result == Result.FAILURE
    assert api.jwt_requests == [] and not out.exists()
    assert (
        "OIDC ID tokens: off (the workflow's `permissions:` set id-token: not granted "
        "(ID tokens need id-token: write))" in task.log_rows
    )
    assert "##[error]no ID token: Error message: Unable to get ACTIONS_ID_TOKEN_REQUEST_URL env variable" in rows_of(
        task, 0
    )


async def test_a_pool_without_identity_says_why_there_is_no_token(executor_harness: ExecutorHarness) -> None:
    task = await executor_harness.run_job(
        """
on: push
permissions:
  id-token: write
jobs:
  deploy:
    runs-on: self-hosted
    steps:
      - run: echo "url=[$ACTIONS_ID_TOKEN_REQUEST_URL]"
"""
    )
    assert task.result == Result.SUCCESS
    assert "url=[]" in rows_of(task, 0)
    assert (
        "##[warning]OIDC ID tokens are not available: the workflow's `permissions:` grant id-token: write, "
        "but pool test issues no workload identity to its jobs, so ACTIONS_ID_TOKEN_REQUEST_URL is not set."
    ) in task.log_rows
