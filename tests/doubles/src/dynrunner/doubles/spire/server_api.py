"""The SPIRE Server API's Agent, Entry and SVID services, as SPIRE's server implements them
(spire: pkg/server/api/agent/v1/service.go, entry/v1/service.go, svid/v1/service.go,
pkg/server/api/middleware and pkg/server/authpolicy for who may call what).

Who may call (`Caller`): the server's local socket is the admin API, every admin RPC is
allowed there; over TCP (TLS) an admin RPC needs an admin X509-SVID (an `admin_ids` ID, or
the ID of an entry marked `admin`), `AttestAgent` needs nothing, and the agent RPCs
(`GetAuthorizedEntries`, `BatchNewX509SVID`) need the X509-SVID of an attested agent that is
not banned and was not deleted — else PERMISSION_DENIED.

Join tokens (`CreateJoinToken`): `ttl` ≥ 1 s is required, the value is a UUID unless given,
and with `agent_id` an entry aliases the agent: parent = the join-token agent ID, SPIFFE ID
= `agent_id`, selector `spiffe_id:<join-token agent ID>`. `AttestAgent` with
`join_token` data looks the token up, deletes it (single use), refuses it expired, and
makes the agent `spiffe://<td>/spire/agent/join_token/<token>` (not reattestable), signing
the public key of the agent's CSR.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import grpc
from cryptography import x509

from dynrunner.doubles.spire._gen.api.server.agent.v1 import agent_pb2, agent_pb2_grpc
from dynrunner.doubles.spire._gen.api.server.entry.v1 import entry_pb2, entry_pb2_grpc
from dynrunner.doubles.spire._gen.api.server.svid.v1 import svid_pb2, svid_pb2_grpc
from dynrunner.doubles.spire._gen.api.types import types_pb2 as types
from dynrunner.doubles.spire.ca import TrustDomainCA
from dynrunner.doubles.spire.entries import Entry, EntryStore, Selector

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
AGENT_SVID_TTL = dt.timedelta(hours=1)


def spiffe_id(value: types.SPIFFEID) -> str:
    return f"spiffe://{value.trust_domain}{value.path}"


def to_proto_id(value: str) -> types.SPIFFEID:
    trust_domain, _, path = value.removeprefix("spiffe://").partition("/")
    return types.SPIFFEID(trust_domain=trust_domain, path=f"/{path}" if path else "")


def entry_to_proto(entry: Entry) -> types.Entry:
    return types.Entry(
        id=entry.id,
        spiffe_id=to_proto_id(entry.spiffe_id),
        parent_id=to_proto_id(entry.parent_id),
        selectors=[types.Selector(type=kind, value=value) for kind, value in sorted(entry.selectors)],
        x509_svid_ttl=int(entry.x509_svid_ttl.total_seconds()) if entry.x509_svid_ttl else 0,
        federates_with=list(entry.federates_with),
        admin=entry.admin,
        downstream=entry.downstream,
        dns_names=list(entry.dns_names),
        hint=entry.hint,
    )


def entry_from_proto(message: types.Entry) -> Entry:
    return Entry(
        spiffe_id=spiffe_id(message.spiffe_id),
        parent_id=spiffe_id(message.parent_id),
        selectors=frozenset((s.type, s.value) for s in message.selectors),
        x509_svid_ttl=dt.timedelta(seconds=message.x509_svid_ttl) if message.x509_svid_ttl else None,
        dns_names=tuple(message.dns_names),
        hint=message.hint,
        federates_with=tuple(message.federates_with),
        admin=message.admin,
        downstream=message.downstream,
        id=message.id or str(uuid.uuid4()),
    )


@dataclass
class AttestedAgent:
    spiffe_id: str
    attestation_type: str
    serial: int
    expires_at: dt.datetime
    banned: bool = False
    selectors: frozenset[Selector] = frozenset()

    def to_proto(self) -> types.Agent:
        return types.Agent(
            id=to_proto_id(self.spiffe_id),
            attestation_type=self.attestation_type,
            x509svid_serial_number=str(self.serial),
            x509svid_expires_at=int(self.expires_at.timestamp()),
            selectors=[types.Selector(type=k, value=v) for k, v in sorted(self.selectors)],
            banned=self.banned,
            can_reattest=False,
        )


@dataclass(frozen=True)
class Caller:
    """Who called: over the local socket, or over TLS with this X509-SVID (leaf), or neither."""

    local: bool
    svid: x509.Certificate | None = None

    @property
    def spiffe_id(self) -> str:
        if self.svid is None:
            return ""
        sans = self.svid.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
        return uris[0] if uris else ""


@dataclass
class ServerState:
    """What the server keeps: the CA, the entries, the join tokens and the attested agents."""

    ca: TrustDomainCA
    entries: EntryStore
    admin_ids: frozenset[str] = frozenset()
    tokens: dict[str, dt.datetime] = field(default_factory=dict)
    agents: dict[str, AttestedAgent] = field(default_factory=dict)

    @property
    def trust_domain(self) -> str:
        return self.ca.trust_domain

    def join_token_agent_id(self, token: str) -> str:
        return f"spiffe://{self.trust_domain}/spire/agent/join_token/{token}"

    def is_admin(self, caller: Caller) -> bool:
        if caller.local:
            return True
        identity = caller.spiffe_id
        return bool(identity) and (
            identity in self.admin_ids or any(e.admin and e.spiffe_id == identity for e in self.entries.entries())
        )

    def agent_of(self, caller: Caller) -> AttestedAgent | None:
        """The attested, unbanned agent whose current SVID the caller presents."""
        agent = self.agents.get(caller.spiffe_id) if caller.svid is not None else None
        if agent is None or agent.banned or caller.svid is None or agent.serial != caller.svid.serial_number:
            return None
        return agent

    def authorized_entries(self, agent: AttestedAgent) -> list[Entry]:
        """The agent's entries: parented on it or on a node alias it matches, and their descendants."""
        all_entries = self.entries.entries()
        parents = {agent.spiffe_id} | {
            e.spiffe_id
            for e in all_entries
            if e.parent_id == self.entries.server_id and e.selectors and e.selectors <= agent.selectors
        }
        found: dict[str, Entry] = {}
        grew = True
        while grew:
            grew = False
            for entry in all_entries:
                if entry.id not in found and entry.parent_id in parents:
                    found[entry.id] = entry
                    parents.add(entry.spiffe_id)
                    grew = True
        return sorted(found.values(), key=lambda e: e.id)


async def _require_admin(state: ServerState, caller: Caller, context: Context) -> None:
    if not state.is_admin(caller):
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED, "authorization denied for method: caller is not an admin"
        )


async def _require_agent(state: ServerState, caller: Caller, context: Context) -> AttestedAgent:
    agent = state.agent_of(caller)
    if agent is None:
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED, "authorization denied for method: caller is not an agent"
        )
    assert agent is not None
    return agent


class AgentService(agent_pb2_grpc.AgentServicer):
    def __init__(self, state: ServerState, caller_of: Any) -> None:
        self.state = state
        self.caller_of = caller_of

    async def CreateJoinToken(self, request: agent_pb2.CreateJoinTokenRequest, context: Context) -> types.JoinToken:
        await _require_admin(self.state, self.caller_of(context), context)
        if request.ttl < 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ttl is required, you must provide one")
        token = request.token or str(uuid.uuid4())
        if token in self.state.tokens:
            # As SPIRE 1.13.3 on its SQL datastore: the unique index refuses it (not ALREADY_EXISTS).
            await context.abort(
                grpc.StatusCode.INTERNAL,
                "failed to create token: datastore-sql: UNIQUE constraint failed: join_tokens.token",
            )
        if request.HasField("agent_id"):
            alias = spiffe_id(request.agent_id)
            if request.agent_id.trust_domain != self.state.trust_domain or not request.agent_id.path:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid agent ID: {alias!r}")
            if request.agent_id.path.startswith("/spire/"):  # SPIRE's VerifyTrustDomainWorkloadID
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f'invalid agent ID: "{alias}" is not a workload in trust domain '
                    f'"{self.state.trust_domain}"; path is in the reserved namespace',
                )
        expires_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=request.ttl)
        self.state.tokens[token] = expires_at
        if request.HasField("agent_id"):
            agent_id = self.state.join_token_agent_id(token)
            self.state.entries.put(
                Entry(spiffe_id=alias, parent_id=agent_id, selectors=frozenset({("spiffe_id", agent_id)}))
            )
        return types.JoinToken(value=token, expires_at=int(expires_at.timestamp()))

    async def AttestAgent(
        self, request_iterator: AsyncIterator[agent_pb2.AttestAgentRequest], context: Context
    ) -> AsyncIterator[agent_pb2.AttestAgentResponse]:
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("params"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed param: missing params")
        assert first is not None
        data = first.params.data
        if data.type != "join_token":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f'could not find node attestor type "{data.type}"')
        token = data.payload.decode(errors="replace")
        expires_at = self.state.tokens.pop(token, None)
        if expires_at is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "failed to attest: join token does not exist or has already been used"
            )
        assert expires_at is not None
        if expires_at < dt.datetime.now(dt.UTC):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "join token expired")  # SPIRE: no prefix
        agent_id = self.state.join_token_agent_id(token)
        known = self.state.agents.get(agent_id)
        if known is not None and known.banned:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "failed to attest: agent is banned")
        try:
            csr = x509.load_der_x509_csr(first.params.params.csr)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"failed to parse CSR: {err}")
            raise
        svid = self.state.ca.sign(agent_id, AGENT_SVID_TTL, public_key=csr.public_key())  # type: ignore[arg-type]
        serial = x509.load_der_x509_certificate(svid.chain_der).serial_number
        self.state.agents[agent_id] = AttestedAgent(agent_id, "join_token", serial, svid.not_after)
        yield agent_pb2.AttestAgentResponse(
            result=agent_pb2.AttestAgentResponse.Result(
                svid=types.X509SVID(
                    cert_chain=[svid.chain_der],
                    id=to_proto_id(agent_id),
                    expires_at=int(svid.not_after.timestamp()),
                ),
                reattestable=False,
            )
        )

    async def ListAgents(self, request: agent_pb2.ListAgentsRequest, context: Context) -> agent_pb2.ListAgentsResponse:
        await _require_admin(self.state, self.caller_of(context), context)
        wanted = request.filter.by_attestation_type
        agents = [a for a in self.state.agents.values() if not wanted or a.attestation_type == wanted]
        agents.sort(key=lambda a: a.spiffe_id)
        return agent_pb2.ListAgentsResponse(**_page(agents, request.page_size, request.page_token, "agents"))

    async def GetAgent(self, request: agent_pb2.GetAgentRequest, context: Context) -> types.Agent:
        await _require_admin(self.state, self.caller_of(context), context)
        agent = self.state.agents.get(spiffe_id(request.id))
        if agent is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "agent not found")
        assert agent is not None
        return agent.to_proto()

    async def DeleteAgent(self, request: agent_pb2.DeleteAgentRequest, context: Context) -> Any:
        from google.protobuf import empty_pb2

        await _require_admin(self.state, self.caller_of(context), context)
        if self.state.agents.pop(spiffe_id(request.id), None) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "agent not found")
        return empty_pb2.Empty()

    async def BanAgent(self, request: agent_pb2.BanAgentRequest, context: Context) -> Any:
        from google.protobuf import empty_pb2

        await _require_admin(self.state, self.caller_of(context), context)
        agent = self.state.agents.get(spiffe_id(request.id))
        if agent is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "agent not found")
        assert agent is not None
        agent.banned = True
        return empty_pb2.Empty()


def _page(items: list[Any], size: int, token: str, name: str) -> dict[str, Any]:
    start = int(token) if token.isdigit() else 0
    if size <= 0:
        return {name: [i.to_proto() if hasattr(i, "to_proto") else i for i in items[start:]]}
    chunk = items[start : start + size]
    # As SPIRE's SQL datastore: a page with anything in it carries a token (its last row), even
    # the last one; only an empty page ends the listing (one request more than needed).
    return {
        name: [i.to_proto() if hasattr(i, "to_proto") else i for i in chunk],
        "next_page_token": str(start + len(chunk)) if chunk else "",
    }


def _matches(entry: Entry, request: entry_pb2.ListEntriesRequest) -> bool:
    f = request.filter
    if f.HasField("by_spiffe_id") and entry.spiffe_id != spiffe_id(f.by_spiffe_id):
        return False
    if f.HasField("by_parent_id") and entry.parent_id != spiffe_id(f.by_parent_id):
        return False
    if f.HasField("by_selectors"):
        wanted = {(s.type, s.value) for s in f.by_selectors.selectors}
        match = f.by_selectors.match
        behaviour = types.SelectorMatch
        if match == behaviour.MATCH_EXACT and entry.selectors != wanted:
            return False
        if match == behaviour.MATCH_SUBSET and not entry.selectors <= wanted:
            return False
        if match == behaviour.MATCH_SUPERSET and not entry.selectors >= wanted:
            return False
        if match == behaviour.MATCH_ANY and not entry.selectors & wanted:
            return False
    return True


def _status(code: grpc.StatusCode, message: str = "") -> types.Status:
    return types.Status(code=code.value[0], message=message)


class EntryService(entry_pb2_grpc.EntryServicer):
    def __init__(self, state: ServerState, caller_of: Any) -> None:
        self.state = state
        self.caller_of = caller_of

    async def ListEntries(
        self, request: entry_pb2.ListEntriesRequest, context: Context
    ) -> entry_pb2.ListEntriesResponse:
        await _require_admin(self.state, self.caller_of(context), context)
        wanted = request.filter.by_spiffe_id
        if request.HasField("filter") and request.filter.HasField("by_spiffe_id") and wanted.path.startswith("/spire/"):
            # SPIRE: TrustDomainWorkloadIDFromProto; only a workload's ID can be filtered for.
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f'malformed SPIFFE ID filter: "{spiffe_id(wanted)}" is not a workload in trust domain '
                f'"{self.state.trust_domain}"; path is in the reserved namespace',
            )
        found = sorted((e for e in self.state.entries.entries() if _matches(e, request)), key=lambda e: e.id)
        protos = [entry_to_proto(e) for e in found]
        return entry_pb2.ListEntriesResponse(**_page(protos, request.page_size, request.page_token, "entries"))

    async def GetEntry(self, request: entry_pb2.GetEntryRequest, context: Context) -> types.Entry:
        await _require_admin(self.state, self.caller_of(context), context)
        entry = self.state.entries.get(request.id)
        if entry is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "entry not found")
        assert entry is not None
        return entry_to_proto(entry)

    async def BatchCreateEntry(
        self, request: entry_pb2.BatchCreateEntryRequest, context: Context
    ) -> entry_pb2.BatchCreateEntryResponse:
        await _require_admin(self.state, self.caller_of(context), context)
        results = [self._create(message) for message in request.entries]
        return entry_pb2.BatchCreateEntryResponse(results=results)

    def _create(self, message: types.Entry) -> entry_pb2.BatchCreateEntryResponse.Result:
        result = entry_pb2.BatchCreateEntryResponse.Result
        if not message.spiffe_id.trust_domain or not message.spiffe_id.path:
            return result(
                status=_status(grpc.StatusCode.INVALID_ARGUMENT, "failed to convert entry: invalid spiffe ID")
            )
        if not message.parent_id.trust_domain:
            return result(
                status=_status(grpc.StatusCode.INVALID_ARGUMENT, "failed to convert entry: invalid parent ID")
            )
        if not message.selectors:
            return result(
                status=_status(grpc.StatusCode.INVALID_ARGUMENT, "failed to convert entry: selector list is empty")
            )
        entry = entry_from_proto(message)
        for existing in self.state.entries.entries():
            if existing.key() == entry.key():
                return result(
                    status=_status(grpc.StatusCode.ALREADY_EXISTS, "similar entry already exists"),
                    entry=entry_to_proto(existing),
                )
        self.state.entries.put(entry)
        return result(status=_status(grpc.StatusCode.OK, "OK"), entry=entry_to_proto(entry))

    async def BatchDeleteEntry(
        self, request: entry_pb2.BatchDeleteEntryRequest, context: Context
    ) -> entry_pb2.BatchDeleteEntryResponse:
        await _require_admin(self.state, self.caller_of(context), context)
        result = entry_pb2.BatchDeleteEntryResponse.Result
        results = [
            result(status=_status(grpc.StatusCode.OK, "OK"), id=entry_id)
            if self.state.entries.delete(entry_id) is not None
            else result(status=_status(grpc.StatusCode.NOT_FOUND, "entry not found"), id=entry_id)
            for entry_id in request.ids
        ]
        return entry_pb2.BatchDeleteEntryResponse(results=results)

    async def GetAuthorizedEntries(
        self, request: entry_pb2.GetAuthorizedEntriesRequest, context: Context
    ) -> entry_pb2.GetAuthorizedEntriesResponse:
        agent = await _require_agent(self.state, self.caller_of(context), context)
        entries = self.state.authorized_entries(agent)
        return entry_pb2.GetAuthorizedEntriesResponse(entries=[entry_to_proto(e) for e in entries])


class SvidService(svid_pb2_grpc.SVIDServicer):
    def __init__(self, state: ServerState, caller_of: Any) -> None:
        self.state = state
        self.caller_of = caller_of

    async def BatchNewX509SVID(
        self, request: svid_pb2.BatchNewX509SVIDRequest, context: Context
    ) -> svid_pb2.BatchNewX509SVIDResponse:
        agent = await _require_agent(self.state, self.caller_of(context), context)
        authorized = {e.id: e for e in self.state.authorized_entries(agent)}
        return svid_pb2.BatchNewX509SVIDResponse(results=[self._sign(p, authorized) for p in request.params])

    def _sign(
        self, params: svid_pb2.NewX509SVIDParams, authorized: dict[str, Entry]
    ) -> svid_pb2.BatchNewX509SVIDResponse.Result:
        result = svid_pb2.BatchNewX509SVIDResponse.Result
        entry = authorized.get(params.entry_id)
        if entry is None:
            return result(status=_status(grpc.StatusCode.NOT_FOUND, "entry not found or not authorized"))
        try:
            csr = x509.load_der_x509_csr(params.csr)
        except ValueError as err:
            return result(status=_status(grpc.StatusCode.INVALID_ARGUMENT, f"malformed CSR: {err}"))
        svid = self.state.ca.sign(entry.spiffe_id, entry.x509_svid_ttl, entry.dns_names, public_key=csr.public_key())  # type: ignore[arg-type]
        return result(
            status=_status(grpc.StatusCode.OK, "OK"),
            svid=types.X509SVID(
                cert_chain=[svid.chain_der],
                id=to_proto_id(entry.spiffe_id),
                expires_at=int(svid.not_after.timestamp()),
                hint=entry.hint,
            ),
        )


def services(state: ServerState, caller_of: Any) -> Iterable[tuple[Any, Any]]:
    """(servicer, add_to_server) pairs for a grpc.aio server."""
    return (
        (AgentService(state, caller_of), agent_pb2_grpc.add_AgentServicer_to_server),
        (EntryService(state, caller_of), entry_pb2_grpc.add_EntryServicer_to_server),
        (SvidService(state, caller_of), svid_pb2_grpc.add_SVIDServicer_to_server),
    )
