"""`SpireServer`: the SPIRE Server API double on its two listeners, as SPIRE's server has them.

- the local admin socket (`socket_path`, a unix socket; SPIRE's default is
  /tmp/spire-server/private/api.sock): no TLS, every caller is local, so every admin RPC is
  allowed — this is how `spire-server token generate` reaches `CreateJoinToken`;
- the TCP port agents and remote admins dial (`bind_port`): TLS with a server X509-SVID for
  `spiffe://<td>/spire/server` (plus DNS SAN `localhost`: gRPC's TLS checks a host name where
  SPIRE's agent checks the server's SPIFFE ID); the caller is whoever its X509-SVID names (see
  server_api). SPIRE asks for a client certificate without requiring one (an attesting agent
  has none yet); gRPC Python can only require one or not ask, so the double listens twice:
  `address` requires a client X509-SVID, `attest_address` asks for none (there only
  `AttestAgent` gets anywhere, as nothing else is allowed without an identity).

    async with SpireServer.start(tmp_path, trust_domain="example.org") as spire:
        channel = grpc.aio.insecure_channel(spire.admin_target)      # CreateJoinToken, entries
        spire.address, spire.bundle_pem                              # what an agent needs
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dynrunner.doubles.spire.ca import TrustDomainCA
from dynrunner.doubles.spire.entries import EntryStore
from dynrunner.doubles.spire.server_api import Caller, ServerState, services


def _pem(der: bytes) -> bytes:
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)


def _server_credentials(ca: TrustDomainCA, *, client_svid: bool) -> grpc.ServerCredentials:
    key = ec.generate_private_key(ec.SECP256R1())
    svid = ca.sign(f"spiffe://{ca.trust_domain}/spire/server", dt.timedelta(days=1), ("localhost",), key.public_key())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return grpc.ssl_server_credentials(
        [(key_pem, _pem(svid.chain_der))], root_certificates=_pem(ca.bundle_der), require_client_auth=client_svid
    )


class SpireServer:
    def __init__(
        self,
        ca: TrustDomainCA,
        entries: EntryStore,
        socket_path: Path,
        *,
        admin_ids: frozenset[str] = frozenset(),
        host: str = "127.0.0.1",
    ) -> None:
        self.state = ServerState(ca, entries, admin_ids)
        self.socket_path = socket_path
        self.host = host
        self.port = 0
        self.attest_port = 0
        self._server: grpc.aio.Server | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls, trust_domain: str = "example.org", *, admin_ids: frozenset[str] = frozenset()
    ) -> AsyncIterator[SpireServer]:
        """A server with its own CA and entry store; the admin socket in a short temp dir
        (unix socket paths are limited to 107 bytes)."""
        directory = Path(tempfile.mkdtemp(prefix="spire-server-", dir="/tmp"))
        server = cls(TrustDomainCA(trust_domain), EntryStore(trust_domain), directory / "api.sock", admin_ids=admin_ids)
        try:
            await server.serve()
            yield server
        finally:
            await server.stop()
            shutil.rmtree(directory, ignore_errors=True)

    @property
    def trust_domain(self) -> str:
        return self.state.trust_domain

    @property
    def address(self) -> str:
        """host:port for callers with an X509-SVID (mTLS)."""
        return f"localhost:{self.port}"

    @property
    def attest_address(self) -> str:
        """host:port where an agent without an SVID yet attests (TLS)."""
        return f"localhost:{self.attest_port}"

    @property
    def admin_target(self) -> str:
        return f"unix:{self.socket_path}"

    @property
    def bundle_pem(self) -> bytes:
        return _pem(self.state.ca.bundle_der)

    def _caller(self, context: grpc.aio.ServicerContext[Any, Any]) -> Caller:
        if context.peer().startswith("unix:"):
            return Caller(local=True)
        pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
        return Caller(local=False, svid=x509.load_pem_x509_certificate(pem) if pem else None)

    async def serve(self) -> None:
        self._server = grpc.aio.server()
        for servicer, add in services(self.state, self._caller):
            add(servicer, self._server)
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self._server.add_insecure_port(f"unix:{self.socket_path}")
        self.port = self._server.add_secure_port(f"{self.host}:0", _server_credentials(self.state.ca, client_svid=True))
        self.attest_port = self._server.add_secure_port(
            f"{self.host}:0", _server_credentials(self.state.ca, client_svid=False)
        )
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)

    # -- what tests look at ----------------------------------------------------------------

    def agent_ids(self) -> list[str]:
        return sorted(self.state.agents)
