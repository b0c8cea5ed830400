"""The product's SPIRE Server API client (dynrunner.proto.spire) against the SPIRE Server API
double: join tokens with an alias, the alias entry found by its SPIFFE ID, a job's entry made
once and found by its parent, the agent and the entries removed; admin over the local socket
or an admin X509-SVID, refused otherwise."""

from __future__ import annotations

import datetime as dt

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dynrunner.doubles.spire.server import SpireServer
from dynrunner.doubles.spire.vm_agent import attest
from dynrunner.proto.spire import SpireServerClient, SpireServerError, parse_spiffe_id
from tests.fixtures.spire_server import TRUST_DOMAIN

ALIAS = f"spiffe://{TRUST_DOMAIN}/dynrunner/agent/vm/0b6d7d6e-5a8e-4f0e-9a55-3d7c9a6f0c11"


def _mtls(server: SpireServer, spiffe_id: str) -> grpc.aio.Channel:
    key = ec.generate_private_key(ec.SECP256R1())
    svid = server.state.ca.sign(spiffe_id, public_key=key.public_key())
    chain = x509.load_der_x509_certificate(svid.chain_der).public_bytes(serialization.Encoding.PEM)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return grpc.aio.secure_channel(server.address, grpc.ssl_channel_credentials(server.bundle_pem, pem, chain))


def test_spiffe_ids_are_split_as_the_api_spells_them() -> None:
    parsed = parse_spiffe_id("spiffe://example.org/spire/agent/join_token/abc")
    assert (parsed.trust_domain, parsed.path) == ("example.org", "/spire/agent/join_token/abc")
    assert parse_spiffe_id("spiffe://example.org").path == ""
    for bad in ("https://example.org/x", "spiffe:///x"):
        with pytest.raises(ValueError):
            parse_spiffe_id(bad)


async def test_a_token_with_an_alias_joins_one_agent_that_is_removed_with_its_alias(spire_server: SpireServer) -> None:
    async with grpc.aio.insecure_channel(spire_server.admin_target) as channel:
        client = SpireServerClient(channel)
        await client.probe()
        token = await client.create_join_token(600, agent_id=ALIAS)
        assert token.value and abs((token.expires_at - dt.datetime.now(dt.UTC)).total_seconds() - 600) < 5
        assert token.value not in repr(token)
        [alias] = await client.entries_with_spiffe_id(ALIAS)
        agent_id = f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/{token.value}"
        assert (alias.spiffe_id, alias.parent_id) == (ALIAS, agent_id)

        assert await client.delete_agent(agent_id) is False  # not attested yet
        await attest(
            spire_server.attest_address, spire_server.bundle_pem, token.value, ec.generate_private_key(ec.SECP256R1())
        )
        assert spire_server.agent_ids() == [agent_id]
        assert await client.delete_agent(agent_id) is True
        assert spire_server.agent_ids() == []

        assert await client.delete_entries([alias.id, "no-such-entry"]) == [alias.id]
        assert await client.entries_with_spiffe_id(ALIAS) == []
        assert client.requests == 7


async def test_an_alias_in_spires_reserved_namespace_is_refused(spire_server: SpireServer) -> None:
    """As SPIRE's CreateJoinToken (VerifyTrustDomainWorkloadID): no agent ID under `/spire/`.
    The product's alias lies outside it (`builders.agent_alias`)."""
    async with grpc.aio.insecure_channel(spire_server.admin_target) as channel:
        client = SpireServerClient(channel)
        with pytest.raises(SpireServerError) as refused:
            await client.create_join_token(60, agent_id=f"spiffe://{TRUST_DOMAIN}/spire/agent/dynrunner/vm/a1")
        assert "reserved namespace" in str(refused.value)
        assert await client.entries_with_spiffe_id(f"spiffe://{TRUST_DOMAIN}/spire/agent/dynrunner/vm/a1") == []


async def test_entries_are_listed_across_pages(spire_server: SpireServer) -> None:
    async with grpc.aio.insecure_channel(spire_server.admin_target) as channel:
        client = SpireServerClient(channel)
        for _ in range(3):
            await client.create_join_token(60, agent_id=ALIAS)
        found = await client.entries_with_spiffe_id(ALIAS, page_size=2)
        assert len(found) == 3 and len({e.parent_id for e in found}) == 3


async def test_a_job_entry_is_made_once_and_found_by_its_parent(spire_server: SpireServer) -> None:
    job = f"spiffe://{TRUST_DOMAIN}/ci/owner/repo/build"
    async with grpc.aio.insecure_channel(spire_server.admin_target) as channel:
        client = SpireServerClient(channel)
        made = await client.create_entry(job, ALIAS, [("unix", "uid:1001")], x509_svid_ttl_s=600)
        again = await client.create_entry(job, ALIAS, [("unix", "uid:1001")], x509_svid_ttl_s=600)
        assert again == made and (made.spiffe_id, made.parent_id) == (job, ALIAS)
        [stored] = [e for e in spire_server.state.entries.entries() if e.id == made.id]
        assert stored.selectors == frozenset({("unix", "uid:1001")}) and stored.x509_svid_ttl == dt.timedelta(
            seconds=600
        )
        assert await client.entries_with_parent(ALIAS, page_size=1) == [made]
        assert made in await client.all_entries(page_size=1)
        with pytest.raises(SpireServerError) as refused:
            await client.create_entry(job, ALIAS, [])
        assert refused.value.code == "INVALID_ARGUMENT"


async def test_the_admin_rpcs_need_an_admin_svid_over_tcp() -> None:
    admin = f"spiffe://{TRUST_DOMAIN}/dynrunner/controller"
    async with SpireServer.start(TRUST_DOMAIN, admin_ids=frozenset({admin})) as server:
        async with _mtls(server, admin) as channel:
            client = SpireServerClient(channel)
            await client.probe()
            assert (await client.create_join_token(60, agent_id=ALIAS)).value
        async with _mtls(server, f"spiffe://{TRUST_DOMAIN}/someone") as channel:
            with pytest.raises(SpireServerError) as denied:
                await SpireServerClient(channel).create_join_token(60)
        assert denied.value.code == "PERMISSION_DENIED" and not denied.value.transient
        assert "CreateJoinToken" in str(denied.value)


async def test_an_unreachable_server_is_a_transient_error_after_retries(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(f"unix:{tmp_path}/nothing.sock") as channel:
        client = SpireServerClient(channel, timeout_s=1, attempts=2)
        with pytest.raises(SpireServerError) as down:
            await client.entries_with_spiffe_id(ALIAS)
    assert down.value.transient and client.requests == 2
