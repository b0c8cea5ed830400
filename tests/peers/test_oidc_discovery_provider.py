"""SPIRE's real OIDC discovery provider (`oidc-discovery-provider` of the SPIRE build in the peers
cache) publishing the JWT bundle of a Workload API: it reads the bundle the Workload API double
streams (FetchJWTBundles), serves `/.well-known/openid-configuration` and `/keys`, and a relying
party that discovers the keys there, as AWS, GCP and Vault do, accepts a JWT-SVID of the double
for its audience, issuer and subject. What a relying party of the real SPIRE agent's tokens would
run against is the same program; the agent issuing them is the real-SPIRE fixture's part."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from spiffe import WorkloadApiClient

from tests.fixtures.oidc import Refused, verify
from tests.fixtures.peers import built, why_not_built
from tests.fixtures.workload_api import workload_api

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ISSUER = "https://oidc.example.org"
DEPLOY = "spiffe://example.org/ci/acme/widgets/deploy/refs/heads/main"


def provider_binary() -> Path:
    spire = built("spire", "1.13")
    if spire is None:
        pytest.skip(why_not_built("spire", "1.13"))
    binary = spire.binary("oidc-discovery-provider")
    if not binary.is_file():
        pytest.skip(
            f"the SPIRE build in {spire.path} has no oidc-discovery-provider: its recipe "
            "(tests/fixtures/peers.py) must also build github.com/spiffe/spire/support/oidc-discovery-provider"
        )
    return binary


def get(port: int, path: str) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": "localhost"})
    with urllib.request.urlopen(request, timeout=2) as response:
        return bytes(response.read())


@pytest.fixture
def socket() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="odp-") as directory:
        yield Path(directory) / "agent.sock"


def test_the_real_provider_publishes_keys_that_verify_the_jwt_svids(
    socket: Path, tmp_path: Path, reserved_port: int
) -> None:
    binary = provider_binary()
    port = reserved_port
    config = tmp_path / "oidc-discovery-provider.conf"
    config.write_text(
        f'log_level = "debug"\ndomains = ["localhost"]\ninsecure_addr = "127.0.0.1:{port}"\n'
        f'allow_insecure_scheme = true\njwt_issuer = "{ISSUER}"\n'
        f'workload_api {{\n  socket_path = "{socket}"\n  trust_domain = "example.org"\n  poll_interval = "1s"\n}}\n'
    )
    with workload_api(socket, [DEPLOY], issuer=ISSUER):
        proc = subprocess.Popen([str(binary), "-config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    keys = get(port, "/keys")
                    break
                except OSError:
                    assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
                    assert time.monotonic() < deadline, "the provider served no keys within 30s"
                    time.sleep(0.2)
            discovery = json.loads(get(port, "/.well-known/openid-configuration"))
            with WorkloadApiClient(socket_path=f"unix://{socket}") as client:
                token = client.fetch_jwt_svid({"sts.example"}, timeout=5).token
        finally:
            proc.terminate()
            proc.communicate(timeout=10)
    assert discovery["issuer"] == ISSUER and discovery["jwks_uri"] == f"{ISSUER}/keys"
    assert "ES256" in discovery["id_token_signing_alg_values_supported"]
    claims = verify(token, keys, audience="sts.example", subject=DEPLOY, issuer=ISSUER)
    assert claims["sub"] == DEPLOY
    with pytest.raises(Refused, match="InvalidAudienceError"):
        verify(token, keys, audience="vault.example", subject=DEPLOY, issuer=ISSUER)
