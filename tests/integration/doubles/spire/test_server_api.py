"""The SPIRE Server API contract over gRPC — who may call what, join tokens, entries, agents —
against the double and the real spire-server (`spire_api`, one parametrised fixture): what
the double answers must be what SPIRE answers (divergences: docs/compatibility.md)."""

from __future__ import annotations

import asyncio
import datetime as dt

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dynrunner.doubles.spire._gen.api.server.agent.v1 import agent_pb2, agent_pb2_grpc
from dynrunner.doubles.spire._gen.api.server.entry.v1 import entry_pb2, entry_pb2_grpc
from dynrunner.doubles.spire._gen.api.types import types_pb2 as types
from dynrunner.doubles.spire.server_api import to_proto_id
from tests.fixtures.spire_server import ADMIN_ID, TRUST_DOMAIN, SpireUnderTest, attest_on

JOB = f"spiffe://{TRUST_DOMAIN}/ci/owner/repo/build"


def _entry(spiffe_id: str, parent: str, *selectors: str) -> types.Entry:
    return types.Entry(
        spiffe_id=to_proto_id(spiffe_id),
        parent_id=to_proto_id(parent),
        selectors=[types.Selector(type=s.split(":", 1)[0], value=s.split(":", 1)[1]) for s in selectors],
    )


async def test_create_join_token_needs_a_ttl_and_unique_value(spire_api: SpireUnderTest) -> None:
    admin = spire_api.admin()
    with pytest.raises(grpc.aio.AioRpcError) as no_ttl:
        await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest())
    assert no_ttl.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    token = await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60, token="chosen"))
    assert token.value == "chosen"
    assert abs(token.expires_at - (dt.datetime.now(dt.UTC).timestamp() + 60)) < 5
    with pytest.raises(grpc.aio.AioRpcError) as twice:
        await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60, token="chosen"))
    assert (twice.value.code(), twice.value.details()) == (
        grpc.StatusCode.INTERNAL,
        "failed to create token: datastore-sql: UNIQUE constraint failed: join_tokens.token",
    ), "SPIRE's SQL datastore refuses it; there is no ALREADY_EXISTS"
    await admin.channel.close()


async def test_admin_rpcs_need_the_local_socket_or_an_admin_svid(spire_api: SpireUnderTest) -> None:
    async with spire_api.channel(ADMIN_ID) as channel:
        token = await agent_pb2_grpc.AgentStub(channel).CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60))
        assert token.value
    async with spire_api.channel(f"spiffe://{TRUST_DOMAIN}/someone") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await agent_pb2_grpc.AgentStub(channel).CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60))
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    async with spire_api.channel(None) as anonymous:
        with pytest.raises(grpc.aio.AioRpcError) as nobody:
            await entry_pb2_grpc.EntryStub(anonymous).ListEntries(entry_pb2.ListEntriesRequest())
    assert nobody.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_an_agent_sees_only_its_entries_until_it_is_deleted_or_banned(spire_api: SpireUnderTest) -> None:
    admin = spire_api.admin()
    tokens = [await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60)) for _ in range(2)]
    agents = []
    for token in tokens:
        key = ec.generate_private_key(ec.SECP256R1())
        async with spire_api.channel(None) as channel:
            svid = await attest_on(channel, token.value, key)
        agent_id = f"spiffe://{TRUST_DOMAIN}{svid.id.path}"
        assert agent_id == f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/{token.value}"
        agents.append((agent_id, svid, key))
    assert await spire_api.agent_ids() == sorted(a for a, _, _ in agents)
    (first, first_svid, first_key), (second, second_svid, second_key) = agents
    created = await admin.entry.BatchCreateEntry(
        entry_pb2.BatchCreateEntryRequest(
            entries=[_entry(JOB, first, "unix:uid:1001"), _entry(JOB, first, "unix:uid:1001")]
        )
    )
    assert [r.status.code for r in created.results] == [0, grpc.StatusCode.ALREADY_EXISTS.value[0]]
    entry_id = created.results[0].entry.id
    assert created.results[1].entry.id == entry_id
    # SPIRE's server answers agents from an entry cache it refreshes every few seconds
    # (`cache_reload_interval`, 5 s): a new entry reaches its agent within that, not at once.
    authorized: list[list[str]] = []
    for _ in range(100):
        authorized = []
        for svid, key in ((first_svid, first_key), (second_svid, second_key)):
            async with spire_api.channel(None, svid=(svid, key)) as channel:
                answer = await entry_pb2_grpc.EntryStub(channel).GetAuthorizedEntries(
                    entry_pb2.GetAuthorizedEntriesRequest()
                )
            authorized.append([e.id for e in answer.entries])
        if authorized[0]:
            break
        await asyncio.sleep(0.2)
    assert authorized == [[entry_id], []]
    by_parent = await admin.entry.ListEntries(
        entry_pb2.ListEntriesRequest(filter=entry_pb2.ListEntriesRequest.Filter(by_parent_id=to_proto_id(first)))
    )
    assert [e.id for e in by_parent.entries] == [entry_id]

    await admin.agent.BanAgent(agent_pb2.BanAgentRequest(id=to_proto_id(second)))
    await admin.agent.DeleteAgent(agent_pb2.DeleteAgentRequest(id=to_proto_id(first)))
    assert await spire_api.agent_ids() == [second], "a banned agent stays listed; a deleted one is gone"
    for svid, key in ((first_svid, first_key), (second_svid, second_key)):
        async with spire_api.channel(None, svid=(svid, key)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await entry_pb2_grpc.EntryStub(channel).GetAuthorizedEntries(entry_pb2.GetAuthorizedEntriesRequest())
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED, denied.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await admin.agent.DeleteAgent(agent_pb2.DeleteAgentRequest(id=to_proto_id(first)))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    deleted = await admin.entry.BatchDeleteEntry(entry_pb2.BatchDeleteEntryRequest(ids=[entry_id, entry_id]))
    assert [r.status.code for r in deleted.results] == [0, grpc.StatusCode.NOT_FOUND.value[0]]
    await admin.channel.close()


async def test_a_join_token_with_an_agent_id_creates_the_alias_entry(spire_api: SpireUnderTest) -> None:
    admin = spire_api.admin()
    alias = to_proto_id(f"spiffe://{TRUST_DOMAIN}/vm/42")
    token = await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60, agent_id=alias))
    listed = await admin.entry.ListEntries(
        entry_pb2.ListEntriesRequest(filter=entry_pb2.ListEntriesRequest.Filter(by_spiffe_id=alias))
    )
    (entry,) = listed.entries
    agent_id = f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/{token.value}"
    assert entry.parent_id == to_proto_id(agent_id)
    assert [(s.type, s.value) for s in entry.selectors] == [("spiffe_id", agent_id)]
    await admin.channel.close()


async def test_an_alias_in_the_reserved_namespace_is_refused(spire_api: SpireUnderTest) -> None:
    admin = spire_api.admin()
    alias = to_proto_id(f"spiffe://{TRUST_DOMAIN}/spire/agent/dynrunner/vm/a1")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60, agent_id=alias))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reserved namespace" in (refused.value.details() or "")
    await admin.channel.close()


async def test_a_used_or_expired_join_token_is_refused(spire_api: SpireUnderTest) -> None:
    admin = spire_api.admin()
    used = await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60))
    expiring = await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=1))
    async with spire_api.channel(None) as channel:
        await attest_on(channel, used.value, ec.generate_private_key(ec.SECP256R1()))
    await asyncio.sleep(1.5)
    for token, why in (
        (used.value, "failed to attest: join token does not exist or has already been used"),
        (expiring.value, "join token expired"),
    ):
        async with spire_api.channel(None) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await attest_on(channel, token, ec.generate_private_key(ec.SECP256R1()))
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, why)
    await admin.channel.close()
