"""The SPIRE side of a pool's microVMs: a one-time join token per VM, the job's entry, and both
removed with the VM (docs/opensandbox.md, "Identity").

Each token is minted with an *alias* (`CreateJoinToken`'s `agent_id`): the SPIRE server then
makes an entry that gives whichever agent attests with the token a second SPIFFE ID, the
job's `builders.agent_alias` — known before the VM boots, derived from the assignment id. The
job's entry is parented on the alias, so it never names the token: the token exists only in
the controller's memory for a moment, in the SPIRE server, and in the VM until its agent has
attested (the entrypoint deletes it then; SPIRE accepts a token once). A controller that
restarts needs no token it minted before: it finds the agent through the alias entry (whose
parent is the agent's join-token ID) when the VM goes.

The job's entry (its SPIFFE ID, parent the alias, selector `unix:uid:<executor uid>`) is made
through SPIRE's Entry API, with the same admin access the tokens need: a VM pool needs no
Kubernetes API. A spire-controller-manager that manages the same server deletes entries it
did not make unless it runs with `entryIDPrefix` (docs/opensandbox.md says so).

The controller reaches the server's admin API through its admin socket or with mTLS and an
admin X509-SVID from files (rotated by whatever keeps them fresh, e.g. spiffe-helper: the
channel is made again when a file changes). With mTLS the server is verified by its SPIFFE ID,
`spiffe://<the SVID's trust domain>/spire/server`, as SPIRE's agents do: its certificate
names no host (spire_tls).
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cryptography import x509

from dynrunner.controller.backends.opensandbox.config import SpireServerConfig
from dynrunner.controller.backends.opensandbox.spire_tls import SpiffeTlsBridge, server_spiffe_id
from dynrunner.proto.spire import SpireServerClient, SpireServerError

log = logging.getLogger(__name__)

__all__ = ["Agents", "JoinGrant", "SpireServerError"]


@dataclass(frozen=True, slots=True)
class JoinGrant:
    """What one VM needs to join: the token and the trust bundle to verify the server with."""

    token: str = field(repr=False)
    bundle_pem: bytes = field(default=b"", repr=False)


def _trust_domain_of(cert_pem: bytes) -> str:
    """The trust domain of the admin X509-SVID (the server's own: SPIRE signed it)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        sans = None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier) if sans else []:
        if uri.startswith("spiffe://"):
            return uri.removeprefix("spiffe://").partition("/")[0]
    raise ValueError("the admin certificate is not an X509-SVID (no spiffe:// URI SAN)")


class Agents:
    def __init__(self, config: SpireServerConfig) -> None:
        self._config = config
        self._channel: grpc.aio.Channel | None = None
        self._client: SpireServerClient | None = None
        self._files_seen: tuple[float, ...] = ()
        self._bridge: SpiffeTlsBridge | None = None
        self.requests = 0
        """RPCs sent on channels already closed (the current client counts its own)."""

    @property
    def target(self) -> str:
        if self._config.socket_path is not None:
            return f"unix:{self._config.socket_path}"
        return self._config.address

    def _files(self) -> list[Path]:
        return [p for p in (self._config.cert_file, self._config.key_file, self._config.bundle_file) if p is not None]

    def _stamp(self) -> tuple[float, ...]:
        stamp = []
        for path in self._files():
            try:
                stamp.append(os.stat(path).st_mtime)
            except OSError:
                stamp.append(-1.0)
        return tuple(stamp)

    async def client(self) -> SpireServerClient:
        """The client on a channel made with the current credential files."""
        stamp = self._stamp()
        if self._client is not None and stamp == self._files_seen:
            return self._client
        await self.aclose()
        cfg = self._config
        if cfg.socket_path is not None:
            channel = grpc.aio.insecure_channel(f"unix:{cfg.socket_path}")
        else:
            assert cfg.cert_file and cfg.key_file and cfg.bundle_file, "SpireServerConfig checks them"
            try:
                server_id = server_spiffe_id(_trust_domain_of(cfg.cert_file.read_bytes()))
                bridge = SpiffeTlsBridge(
                    cfg.address,
                    cert_file=cfg.cert_file,
                    key_file=cfg.key_file,
                    bundle_file=cfg.bundle_file,
                    server_id=server_id,
                    sni=cfg.server_name,
                )
                await bridge.start()
            except (OSError, ValueError, ssl.SSLError) as err:
                raise SpireServerError("UNAVAILABLE", f"the admin X509-SVID cannot be used: {err}", "connect") from None
            self._bridge = bridge
            channel = grpc.aio.insecure_channel(bridge.target)
        self._channel = channel
        self._client = SpireServerClient(channel, timeout_s=cfg.request_timeout_s)
        self._files_seen = stamp
        return self._client

    @property
    def sent(self) -> int:
        return self.requests + (self._client.requests if self._client is not None else 0)

    async def aclose(self) -> None:
        if self._client is not None:
            self.requests += self._client.requests
        if self._channel is not None:
            await self._channel.close()
        if self._bridge is not None:
            await self._bridge.aclose()
        self._channel, self._client, self._bridge = None, None, None

    async def grant(self, alias: str) -> JoinGrant:
        """A new join token whose agent gets the SPIFFE ID `alias` too."""
        client = await self.client()
        token = await client.create_join_token(self._config.join_token_ttl_s, agent_id=alias)
        bundle = b""
        if self._config.bundle_file is not None:
            try:
                bundle = self._config.bundle_file.read_bytes()
            except OSError as err:
                log.warning(
                    "the trust bundle %s cannot be read (%s); VMs use their image's", self._config.bundle_file, err
                )
        return JoinGrant(token.value, bundle)

    async def revoke(self, alias: str, token: str) -> None:
        """Make an unused token worthless: SPIRE cannot delete a join token, but without its
        alias entry an agent that attests with it gets no job's identity."""
        client = await self.client()
        parent = f"/spire/agent/join_token/{token}"
        await client.delete_entries(
            [entry.id for entry in await client.entries_with_spiffe_id(alias) if entry.parent_id.endswith(parent)]
        )

    async def register(self, spiffe_id: str, alias: str, uid: int, ttl_s: int) -> None:
        """The job's entry: `spiffe_id` for the process of user `uid` under the VM's agent."""
        client = await self.client()
        await client.create_entry(spiffe_id, alias, [("unix", f"uid:{uid}")], x509_svid_ttl_s=ttl_s)

    async def remove(self, alias: str) -> list[str]:
        """Delete the job's entries, every agent that joined under `alias`, and the alias
        entries (of tokens used or not); returns the agents deleted."""
        client = await self.client()
        await client.delete_entries([entry.id for entry in await client.entries_with_parent(alias)])
        aliases = await client.entries_with_spiffe_id(alias)
        agents = [entry.parent_id for entry in aliases if "/spire/agent/join_token/" in entry.parent_id]
        deleted = [agent for agent in agents if await client.delete_agent(agent)]
        await client.delete_entries([entry.id for entry in aliases])
        return deleted

    async def aliases_under(self, prefix: str) -> set[str]:
        """The aliases (`prefix` + assignment id) that entries are parented on or named, for
        finding leftovers: one listing of every entry."""
        client = await self.client()
        found = set()
        for entry in await client.all_entries():
            for spiffe_id in (entry.parent_id, entry.spiffe_id):
                if spiffe_id.startswith(prefix) and "/" not in spiffe_id.removeprefix(prefix):
                    found.add(spiffe_id)
        return found

    async def probe(self) -> None:
        await (await self.client()).probe()
