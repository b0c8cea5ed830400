"""The SPIRE Server API double over gRPC: who may call what, join tokens, entries, agents."""

from __future__ import annotations

import datetime as dt

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dynrunner.doubles.spire._gen.api.server.agent.v1 import agent_pb2, agent_pb2_grpc
from dynrunner.doubles.spire._gen.api.server.entry.v1 import entry_pb2, entry_pb2_grpc
from dynrunner.doubles.spire._gen.api.types import types_pb2 as types
from dynrunner.doubles.spire.server import SpireServer
from dynrunner.doubles.spire.server_api import to_proto_id
from dynrunner.doubles.spire.vm_agent import attest
from tests.fixtures.spire_server import TRUST_DOMAIN, spire_admin

JOB = f"spiffe://{TRUST_DOMAIN}/ci/owner/repo/build"


def _entry(spiffe_id: str, parent: str, *selectors: str) -> types.Entry:
    return types.Entry(
        spiffe_id=to_proto_id(spiffe_id),
        parent_id=to_proto_id(parent),
        selectors=[types.Selector(type=s.split(":", 1)[0], value=s.split(":", 1)[1]) for s in selectors],
    )


def _mtls(server: SpireServer, spiffe_id: str) -> grpc.aio.Channel:
    """A channel presenting an X509-SVID for `spiffe_id` signed by the server's CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    svid = server.state.ca.sign(spiffe_id, public_key=key.public_key())
    chain = x509.load_der_x509_certificate(svid.chain_der).public_bytes(serialization.Encoding.PEM)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return grpc.aio.secure_channel(server.address, grpc.ssl_channel_credentials(server.bundle_pem, pem, chain))


async def test_create_join_token_needs_a_ttl_and_unique_value(spire_server: SpireServer) -> None:
    admin = spire_admin(spire_server)
    with pytest.raises(grpc.aio.AioRpcError) as no_ttl:
        await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest())
    assert no_ttl.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    token = await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60, token="chosen"))
    assert token.value == "chosen"
    assert abs(token.expires_at - (dt.datetime.now(dt.UTC).timestamp() + 60)) < 5
    with pytest.raises(grpc.aio.AioRpcError) as twice:
        await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60, token="chosen"))
    assert twice.value.code() == grpc.StatusCode.ALREADY_EXISTS
    await admin.channel.close()


async def test_admin_rpcs_need_the_local_socket_or_an_admin_svid() -> None:
    admin_id = f"spiffe://{TRUST_DOMAIN}/dynrunner/controller"
    async with SpireServer.start(TRUST_DOMAIN, admin_ids=frozenset({admin_id})) as server:
        async with _mtls(server, admin_id) as channel:
            token = await agent_pb2_grpc.AgentStub(channel).CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60))
            assert token.value
        async with _mtls(server, f"spiffe://{TRUST_DOMAIN}/someone") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await agent_pb2_grpc.AgentStub(channel).CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60))
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        creds = grpc.ssl_channel_credentials(server.bundle_pem)
        async with grpc.aio.secure_channel(server.attest_address, creds) as anonymous:
            with pytest.raises(grpc.aio.AioRpcError) as nobody:
                await entry_pb2_grpc.EntryStub(anonymous).ListEntries(entry_pb2.ListEntriesRequest())
        assert nobody.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_an_agent_sees_only_its_entries_until_it_is_deleted_or_banned(spire_server: SpireServer) -> None:
    admin = spire_admin(spire_server)
    tokens = [await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=60)) for _ in range(2)]
    agents = []
    for token in tokens:
        key = ec.generate_private_key(ec.SECP256R1())
        svid = await attest(spire_server.attest_address, spire_server.bundle_pem, token.value, key)
        chain = x509.load_der_x509_certificate(svid.cert_chain[0]).public_bytes(serialization.Encoding.PEM)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        agent_id = f"spiffe://{TRUST_DOMAIN}{svid.id.path}"
        assert agent_id == f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/{token.value}"
        channel = grpc.aio.secure_channel(
            spire_server.address, grpc.ssl_channel_credentials(spire_server.bundle_pem, pem, chain)
        )
        agents.append((agent_id, channel))
    (first, first_channel), (second, second_channel) = agents
    created = await admin.entry.BatchCreateEntry(
        entry_pb2.BatchCreateEntryRequest(
            entries=[_entry(JOB, first, "unix:uid:1001"), _entry(JOB, first, "unix:uid:1001")]
        )
    )
    assert [r.status.code for r in created.results] == [0, grpc.StatusCode.ALREADY_EXISTS.value[0]]
    entry_id = created.results[0].entry.id
    assert created.results[1].entry.id == entry_id
    mine = await entry_pb2_grpc.EntryStub(first_channel).GetAuthorizedEntries(entry_pb2.GetAuthorizedEntriesRequest())
    theirs = await entry_pb2_grpc.EntryStub(second_channel).GetAuthorizedEntries(
        entry_pb2.GetAuthorizedEntriesRequest()
    )
    assert [e.id for e in mine.entries] == [entry_id] and list(theirs.entries) == []
    by_parent = await admin.entry.ListEntries(
        entry_pb2.ListEntriesRequest(filter=entry_pb2.ListEntriesRequest.Filter(by_parent_id=to_proto_id(first)))
    )
    assert [e.id for e in by_parent.entries] == [entry_id]

    await admin.agent.BanAgent(agent_pb2.BanAgentRequest(id=to_proto_id(second)))
    await admin.agent.DeleteAgent(agent_pb2.DeleteAgentRequest(id=to_proto_id(first)))
    for channel in (first_channel, second_channel):
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await entry_pb2_grpc.EntryStub(channel).GetAuthorizedEntries(entry_pb2.GetAuthorizedEntriesRequest())
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        await channel.close()
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await admin.agent.DeleteAgent(agent_pb2.DeleteAgentRequest(id=to_proto_id(first)))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    deleted = await admin.entry.BatchDeleteEntry(entry_pb2.BatchDeleteEntryRequest(ids=[entry_id, entry_id]))
    assert [r.status.code for r in deleted.results] == [0, grpc.StatusCode.NOT_FOUND.value[0]]
    await admin.channel.close()


async def test_a_join_token_with_an_agent_id_creates_the_alias_entry(spire_server: SpireServer) -> None:
    admin = spire_admin(spire_server)
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


async def test_an_expired_join_token_is_refused(spire_server: SpireServer) -> None:
    admin = spire_admin(spire_server)
    token = await admin.agent.CreateJoinToken(agent_pb2.CreateJoinTokenRequest(ttl=1))
    spire_server.state.tokens[token.value] = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    with pytest.raises(grpc.aio.AioRpcError) as expired:
        await attest(
            spire_server.attest_address, spire_server.bundle_pem, token.value, ec.generate_private_key(ec.SECP256R1())
        )
    assert (expired.value.code(), expired.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to attest: join token expired",
    )
    await admin.channel.close()
