"""`dynrunner-spire-agent-double run -config FILE`: a SPIRE agent that joins with a join token,
for the VM image's entrypoint to start instead of `spire-agent run` in tests.

It reads the same agent config the real agent would (vm/spire-agent.conf.template, rendered:
`server_address`, `server_port`, `socket_path`, `trust_domain`, `trust_bundle_path`,
`join_token_file`), and does what SPIRE's agent does with it (spire: pkg/agent/attestor/node,
pkg/agent/manager, doc/spire_agent.md):

1. attests over TLS (the server verified against the trust bundle) with `AttestAgent`:
   attestation data `join_token` plus a CSR for its own key; the server answers with the
   agent's X509-SVID, `spiffe://<td>/spire/agent/join_token/<token>`;
2. with that SVID (mTLS) polls `Entry/GetAuthorizedEntries` and has each entry's X509-SVID
   signed by `SVID/BatchNewX509SVID` for a key it keeps;
3. serves the Workload API on `socket_path` (the k8s-doubles' `WorkloadApi`: unix workload
   attestation by peer credentials, so an entry authorized for this agent — parented on it
   or on its join token's alias — with `unix:uid:<uid>` reaches exactly the processes of that
   uid). An agent the server deleted or banned gets
   PERMISSION_DENIED on sync and stops issuing identities.

`--server-mtls-port` names the server double's mTLS listener (see server.py for why it has two).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dynrunner.doubles.spire._gen.api.server.agent.v1 import agent_pb2, agent_pb2_grpc
from dynrunner.doubles.spire._gen.api.server.entry.v1 import entry_pb2, entry_pb2_grpc
from dynrunner.doubles.spire._gen.api.server.svid.v1 import svid_pb2, svid_pb2_grpc
from dynrunner.doubles.spire._gen.api.types import types_pb2 as types
from dynrunner.doubles.spire.attestor import unix_selectors
from dynrunner.doubles.spire.ca import Svid
from dynrunner.doubles.spire.entries import Agent, EntryStore
from dynrunner.doubles.spire.jwt import JwtAuthority
from dynrunner.doubles.spire.server_api import entry_from_proto, spiffe_id
from dynrunner.doubles.spire.workload_api import WorkloadApi

SYNC_INTERVAL_S = 0.2
_SETTING = re.compile(r'^\s*(\w+)\s*=\s*"([^"]*)"', re.M)


def read_config(path: Path) -> dict[str, str]:
    """The `key = "value"` settings of the agent block (all our template has)."""
    return dict(_SETTING.findall(path.read_text()))


def _csr(key: ec.EllipticCurvePrivateKey) -> bytes:
    request = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    return request.public_bytes(serialization.Encoding.DER)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class RemoteSigner:
    """What the Workload API needs of a CA (`sign`, `bundle_der`), done the agent's way: a key
    of its own, the certificate from the server for the entry's ID."""

    def __init__(self, channel: grpc.Channel, entries: EntryStore, bundle_pem: bytes) -> None:
        self._svid = svid_pb2_grpc.SVIDStub(channel)
        self._entries = entries
        self.bundle_der = x509.load_pem_x509_certificate(bundle_pem).public_bytes(serialization.Encoding.DER)

    def sign(
        self,
        spiffe_id: str,
        ttl: dt.timedelta | None = None,
        dns_names: tuple[str, ...] = (),
        public_key: object = None,
    ) -> Svid:
        entry = next(e for e in self._entries.entries() if e.spiffe_id == spiffe_id)
        key = ec.generate_private_key(ec.SECP256R1())
        answer = self._svid.BatchNewX509SVID(
            svid_pb2.BatchNewX509SVIDRequest(params=[svid_pb2.NewX509SVIDParams(entry_id=entry.id, csr=_csr(key))])
        )
        result = answer.results[0]
        if result.status.code != grpc.StatusCode.OK.value[0]:
            raise RuntimeError(f"the server refused an SVID for {spiffe_id}: {result.status.message}")
        leaf = x509.load_der_x509_certificate(result.svid.cert_chain[0])
        return Svid(
            spiffe_id,
            b"".join(result.svid.cert_chain),
            key.private_bytes(
                serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
            leaf.not_valid_after_utc,
            leaf.not_valid_before_utc,
        )


async def attest(target: str, bundle_pem: bytes, token: str, key: ec.EllipticCurvePrivateKey) -> types.X509SVID:
    credentials = grpc.ssl_channel_credentials(root_certificates=bundle_pem)
    async with grpc.aio.secure_channel(target, credentials) as channel:

        async def steps() -> AsyncIterator[agent_pb2.AttestAgentRequest]:
            yield agent_pb2.AttestAgentRequest(
                params=agent_pb2.AttestAgentRequest.Params(
                    data=types.AttestationData(type="join_token", payload=token.encode()),
                    params=agent_pb2.AgentX509SVIDParams(csr=_csr(key)),
                )
            )

        async for answer in agent_pb2_grpc.AgentStub(channel).AttestAgent(steps()):
            if answer.HasField("result"):
                return answer.result.svid
    raise RuntimeError("the server ended attestation without a result")


async def sync_entries(channel: grpc.aio.Channel, entries: EntryStore) -> None:
    """Mirror the server's authorized entries into the local store, forever."""
    stub = entry_pb2_grpc.EntryStub(channel)
    while True:
        try:
            answer = await stub.GetAuthorizedEntries(entry_pb2.GetAuthorizedEntriesRequest())
            wanted = {e.id: entry_from_proto(e) for e in answer.entries}
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.PERMISSION_DENIED:
                raise
            print(f"spire-agent-double: {err.details()}; no identities are issued", file=sys.stderr, flush=True)
            wanted = {}
        for entry in entries.entries():
            if wanted.get(entry.id) != entry:
                entries.delete(entry.id)
        for entry_id, entry in wanted.items():
            if entries.get(entry_id) is None:
                entries.put(entry)
        await asyncio.sleep(SYNC_INTERVAL_S)


async def run(config: dict[str, str], bundle_pem: bytes, token: str, mtls_port: int | None) -> None:
    host = config.get("server_address", "localhost")
    port = int(config.get("server_port", "8081"))
    key = ec.generate_private_key(ec.SECP256R1())
    svid = await attest(f"{host}:{port}", bundle_pem, token, key)
    agent_id = spiffe_id(svid.id)
    chain_pem = b"".join(
        x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM) for der in svid.cert_chain
    )
    credentials = grpc.ssl_channel_credentials(bundle_pem, _pem_key(key), chain_pem)
    target = f"{host}:{mtls_port or port}"
    entries = EntryStore(config.get("trust_domain", agent_id.removeprefix("spiffe://").split("/")[0]))
    with grpc.secure_channel(target, credentials) as signing:
        api = WorkloadApi(
            Agent(agent_id),
            entries,
            RemoteSigner(signing, entries, bundle_pem),  # type: ignore[arg-type]
            Path(config["socket_path"]),
            unix_selectors,
            # The real agent has JWT-SVIDs signed by the server (SVID/NewJWTSVID); the server
            # double has no JWT key, so this agent signs with a key of its own.
            jwt_authority=JwtAuthority(entries.trust_domain),
        )
        async with grpc.aio.secure_channel(target, credentials) as channel:
            await api.start()
            print(f"spire-agent-double: attested as {agent_id}", file=sys.stderr, flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            syncing = asyncio.create_task(sync_entries(channel, entries))
            try:
                await asyncio.wait({syncing, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
                if syncing.done():
                    syncing.result()
            finally:
                syncing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await syncing
                await api.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dynrunner-spire-agent-double", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="attest with the join token and serve the Workload API")
    run_parser.add_argument("-config", "--config", type=Path, required=True)
    run_parser.add_argument("--server-mtls-port", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        config = read_config(args.config)
        bundle_pem = Path(config["trust_bundle_path"]).read_bytes()
        token = Path(config["join_token_file"]).read_text().strip()
        asyncio.run(run(config, bundle_pem, token, args.server_mtls_port))
    except (OSError, KeyError, RuntimeError, grpc.RpcError) as err:
        print(f"spire-agent-double: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
