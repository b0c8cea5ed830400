"""`dynrunner-identity` against a real Workload API on a unix socket (the double), as a step
of a job and as a command on its own."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from dynrunner.proto.assignment import IdentityWait
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness, rows_of
from tests.fixtures.oidc import verify
from tests.fixtures.workload_api import workload_api

CLI = str(Path(sys.executable).with_name("dynrunner-identity"))
DEPLOY = "spiffe://example.org/ci/owner/repo/deploy"


@pytest.fixture
def socket() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="idcli-") as directory:
        yield Path(directory) / "agent.sock"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("SPIFFE_ENDPOINT_SOCKET", "GITHUB_ACTIONS")}
    env = {**base, **(env or {})}
    return subprocess.run([CLI, *args], check=False, capture_output=True, text=True, env=env, timeout=60)


def test_jwt_x509_and_bundle(socket: Path, tmp_path: Path) -> None:
    with workload_api(socket, [DEPLOY]):
        env = {"SPIFFE_ENDPOINT_SOCKET": f"unix://{socket}"}
        token_run = cli("jwt", "--audience", "vault.example", env=env)
        masked_run = cli("jwt", "--audience", "vault.example", env={**env, "GITHUB_ACTIONS": "true"})
        jwks_run = cli("bundle", env=env)
        pem_run = cli("--socket", str(socket), "bundle", "--x509")
        out = tmp_path / "svid"
        x509_run = cli("--socket", str(socket), "x509", "--out", str(out))
    assert token_run.returncode == 0, token_run.stderr
    token = token_run.stdout.strip()
    assert token_run.stderr == ""  # outside a job nothing asks for a mask
    jwks = jwks_run.stdout.strip().encode()
    assert json.loads(jwks)["keys"][0]["use"] == "jwt-svid"
    assert verify(token, jwks, audience="vault.example", subject=DEPLOY)["sub"] == DEPLOY
    masked = masked_run.stdout.strip()
    assert masked_run.stderr == f"::add-mask::{masked}\n"

    assert x509_run.returncode == 0, x509_run.stderr
    assert x509_run.stdout.startswith(f"{DEPLOY} valid until ")
    for name in ("svid.pem", "key.pem", "bundle.pem"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    leaf = x509.load_pem_x509_certificates((out / "svid.pem").read_bytes())[0]
    ca = x509.load_pem_x509_certificates((out / "bundle.pem").read_bytes())[0]
    leaf.verify_directly_issued_by(ca)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [DEPLOY]
    assert b"PRIVATE KEY" in (out / "key.pem").read_bytes()
    assert pem_run.stdout == (out / "bundle.pem").read_text()


def test_without_a_workload_api(socket: Path) -> None:
    missing = cli("jwt", "--audience", "x")
    assert missing.returncode == 1
    assert missing.stderr == "dynrunner-identity: no Workload API socket: pass --socket or set SPIFFE_ENDPOINT_SOCKET\n"
    gone = cli("--socket", str(socket), "--timeout", "1", "jwt", "--audience", "x")
    assert gone.returncode == 1 and gone.stderr.startswith("dynrunner-identity: ")
    with workload_api(socket, []):
        refused = cli("--socket", str(socket), "jwt", "--audience", "x")
    assert refused.returncode == 1 and "no identity issued" in refused.stderr


async def test_a_run_step_gets_a_masked_token(executor_harness: ExecutorHarness, socket: Path) -> None:
    """No `permissions:` needed: the Workload API answers every process of the job (see
    docs/identity.md); the executor points SPIFFE_ENDPOINT_SOCKET at the socket the assignment
    names; the CLI is on every step's PATH and its token is masked."""
    identity = IdentityWait(enabled=True, workload_api_socket=str(socket), timeout_seconds=10)
    workflow = """
on: push
jobs:
  deploy:
    runs-on: self-hosted
    steps:
      - run: |
          echo "socket: $SPIFFE_ENDPOINT_SOCKET"
          token=$(dynrunner-identity jwt --audience vault.example)
          echo "token: $token"
          echo "$token" > "$OUT"
"""
    out = executor_harness.root / "token"
    with workload_api(socket, [DEPLOY]):
        claimed = await executor_harness.claim(workflow, identity=identity, spiffe_id=DEPLOY)
        os.environ["OUT"] = str(out)
        try:
            assert await executor_harness.run(claimed) == 0
        finally:
            del os.environ["OUT"]
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS, task.log_rows
    token = out.read_text().strip()
    assert token.count(".") == 2
    assert "token: ***" in rows_of(task, 0)
    assert f"socket: unix://{socket}" in rows_of(task, 0)
    assert not any(token in row for row in task.log_rows)
