"""Async client of the SPIRE Server API, on grpcio: the admin RPCs the controller calls for the
identity of a job that runs in a microVM (docs/opensandbox.md, "Identity").

A microVM's SPIRE agent joins the trust domain with a one-time join token the controller
mints (`Agent/CreateJoinToken`) together with an *alias*: the server then also makes an entry
that gives the attested agent a second SPIFFE ID, known in advance, on which the job's entry
is parented. The job's own entry is registered with `Entry/BatchCreateEntry`. When the VM
goes, the controller finds that alias entry (`Entry/ListEntries` by its SPIFFE ID: its parent
is the agent's join-token ID) and the job's entry (by its parent, the alias), deletes the agent
(`Agent/DeleteAgent`) and the entries (`Entry/BatchDeleteEntry`).

Every RPC here requires a *local* caller (the server's admin socket) or an admin X509-SVID;
the channel (which one) is the caller's. Wire types stay here: callers get small dataclasses.
Calls that are safe to repeat are retried on UNAVAILABLE with backoff (tenacity);
CreateJoinToken is not (a lost answer leaves an unused token that expires on its own).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

import grpc
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from dynrunner.proto._gen.spire.api.server.agent.v1 import agent_pb2, agent_pb2_grpc
from dynrunner.proto._gen.spire.api.server.entry.v1 import entry_pb2, entry_pb2_grpc
from dynrunner.proto._gen.spire.api.types import entry_pb2 as types_entry_pb2
from dynrunner.proto._gen.spire.api.types import selector_pb2, spiffeid_pb2

__all__ = ["EntryRef", "JoinToken", "SpireServerClient", "SpireServerError", "parse_spiffe_id"]

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
PAGE_SIZE = 100
_NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
_OK = grpc.StatusCode.OK.value[0]
_ALREADY_EXISTS = grpc.StatusCode.ALREADY_EXISTS.value[0]


class SpireServerError(Exception):
    """The server refused a call or could not be reached; `code` is the gRPC status name."""

    def __init__(self, code: str, details: str, call: str) -> None:
        super().__init__(f"SPIRE Server {call}: {details or code} ({code})")
        self.code = code
        self.details = details

    @property
    def transient(self) -> bool:
        return self.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")


@dataclass(frozen=True, slots=True)
class JoinToken:
    value: str = field(repr=False)
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class EntryRef:
    """A registration entry as far as the controller cares: its id, SPIFFE ID and parent."""

    id: str
    spiffe_id: str
    parent_id: str


def parse_spiffe_id(spiffe_id: str) -> spiffeid_pb2.SPIFFEID:
    """`spiffe://td/path` as the API spells it (trust domain, path with its leading slash)."""
    if not spiffe_id.startswith("spiffe://"):
        raise ValueError(f"{spiffe_id!r} is not a SPIFFE ID (spiffe://<trust domain>/<path>)")
    trust_domain, slash, path = spiffe_id.removeprefix("spiffe://").partition("/")
    if not trust_domain:
        raise ValueError(f"{spiffe_id!r} has no trust domain")
    return spiffeid_pb2.SPIFFEID(trust_domain=trust_domain, path=slash + path)


def _format(msg: spiffeid_pb2.SPIFFEID) -> str:
    return f"spiffe://{msg.trust_domain}{msg.path}"


def _error(err: grpc.aio.AioRpcError, call: str) -> SpireServerError:
    return SpireServerError(err.code().name, err.details() or "", call)


class SpireServerClient:
    """The calls, on one channel (`grpc.aio.insecure_channel("unix:/…/api.sock")` for the admin
    socket, a secure channel with an admin X509-SVID otherwise). The caller closes the channel."""

    def __init__(self, channel: grpc.aio.Channel, *, timeout_s: float = DEFAULT_TIMEOUT_S, attempts: int = 4) -> None:
        self._agents = agent_pb2_grpc.AgentStub(channel)
        self._entries = entry_pb2_grpc.EntryStub(channel)
        self._timeout_s = timeout_s
        self._attempts = attempts
        self.requests = 0
        """RPCs sent (for benchmarks)."""

    async def _call(self, name: str, call: Callable[[], Awaitable[T]], *, retry: bool = True) -> T:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(lambda e: retry and isinstance(e, SpireServerError) and e.transient),
            stop=stop_after_attempt(self._attempts),
            wait=wait_random_exponential(multiplier=0.2, max=3.0),
            reraise=True,
        ):
            with attempt:
                self.requests += 1
                try:
                    return await call()
                except grpc.aio.AioRpcError as err:
                    raise _error(err, name) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def create_join_token(self, ttl_s: int, *, agent_id: str = "") -> JoinToken:
        """A one-time token valid for `ttl_s` seconds; with `agent_id`, the agent that attests
        with it also gets that SPIFFE ID (the server's alias entry)."""
        request = agent_pb2.CreateJoinTokenRequest(ttl=ttl_s)
        if agent_id:
            request.agent_id.CopyFrom(parse_spiffe_id(agent_id))
        token = await self._call(
            "CreateJoinToken",
            lambda: self._agents.CreateJoinToken(request, timeout=self._timeout_s),
            retry=False,
        )
        return JoinToken(token.value, datetime.fromtimestamp(token.expires_at, UTC))

    async def delete_agent(self, agent_id: str) -> bool:
        """Evict the agent (its SVID can no longer fetch identities); False if it is unknown."""
        request = agent_pb2.DeleteAgentRequest(id=parse_spiffe_id(agent_id))
        try:
            await self._call("DeleteAgent", lambda: self._agents.DeleteAgent(request, timeout=self._timeout_s))
        except SpireServerError as err:
            if err.code == "NOT_FOUND":
                return False
            raise
        return True

    async def create_entry(
        self, spiffe_id: str, parent_id: str, selectors: Sequence[tuple[str, str]], *, x509_svid_ttl_s: int = 0
    ) -> EntryRef:
        """Register a workload entry; an entry with the same SPIFFE ID, parent and selectors
        already there is success (the server answers ALREADY_EXISTS with it)."""
        entry = types_entry_pb2.Entry(
            spiffe_id=parse_spiffe_id(spiffe_id),
            parent_id=parse_spiffe_id(parent_id),
            selectors=[selector_pb2.Selector(type=kind, value=value) for kind, value in selectors],
            x509_svid_ttl=x509_svid_ttl_s,
        )
        request = entry_pb2.BatchCreateEntryRequest(entries=[entry])
        answer = await self._call(
            "BatchCreateEntry", lambda: self._entries.BatchCreateEntry(request, timeout=self._timeout_s)
        )
        [result] = answer.results
        if result.status.code not in (_OK, _ALREADY_EXISTS):
            raise SpireServerError(_code_name(result.status.code), result.status.message, "BatchCreateEntry")
        made = result.entry
        return EntryRef(made.id, _format(made.spiffe_id), _format(made.parent_id))

    async def entries_with_spiffe_id(self, spiffe_id: str, *, page_size: int = PAGE_SIZE) -> list[EntryRef]:
        """Every entry whose SPIFFE ID is `spiffe_id` (all pages)."""
        request = entry_pb2.ListEntriesRequest(page_size=page_size)
        request.filter.by_spiffe_id.CopyFrom(parse_spiffe_id(spiffe_id))
        return await self._entries_listed(request)

    async def entries_with_parent(self, parent_id: str, *, page_size: int = PAGE_SIZE) -> list[EntryRef]:
        """Every entry parented on `parent_id` (all pages)."""
        request = entry_pb2.ListEntriesRequest(page_size=page_size)
        request.filter.by_parent_id.CopyFrom(parse_spiffe_id(parent_id))
        return await self._entries_listed(request)

    async def all_entries(self, *, page_size: int = PAGE_SIZE) -> list[EntryRef]:
        """Every entry of the server (all pages; for collecting leftovers, not per job)."""
        return await self._entries_listed(entry_pb2.ListEntriesRequest(page_size=page_size))

    async def _entries_listed(self, request: entry_pb2.ListEntriesRequest) -> list[EntryRef]:
        found: list[EntryRef] = []
        while True:
            answer = await self._call("ListEntries", functools.partial(self._list_entries, request))
            found += [EntryRef(e.id, _format(e.spiffe_id), _format(e.parent_id)) for e in answer.entries]
            if not answer.next_page_token:
                return found
            request.page_token = answer.next_page_token

    def _list_entries(self, request: entry_pb2.ListEntriesRequest) -> Awaitable[entry_pb2.ListEntriesResponse]:
        return self._entries.ListEntries(request, timeout=self._timeout_s)

    async def delete_entries(self, ids: Sequence[str]) -> list[str]:
        """Delete entries by id; returns those deleted (an unknown id is no error)."""
        if not ids:
            return []
        request = entry_pb2.BatchDeleteEntryRequest(ids=list(ids))
        answer = await self._call(
            "BatchDeleteEntry", lambda: self._entries.BatchDeleteEntry(request, timeout=self._timeout_s)
        )
        deleted = []
        for result in answer.results:
            if result.status.code == _OK:
                deleted.append(result.id)
            elif result.status.code != _NOT_FOUND:
                raise SpireServerError(_code_name(result.status.code), result.status.message, "BatchDeleteEntry")
        return deleted

    async def probe(self) -> None:
        """One cheap admin call (a page of one join-token agent): raises unless the channel
        reaches the server as an admin."""
        request = agent_pb2.ListAgentsRequest(page_size=1)
        request.filter.by_attestation_type = "join_token"
        await self._call("ListAgents", lambda: self._agents.ListAgents(request, timeout=self._timeout_s))


def _code_name(code: int) -> str:
    return next((s.name for s in grpc.StatusCode if s.value[0] == code), "UNKNOWN")
