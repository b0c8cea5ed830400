"""The product's SPIRE Server API client (dynrunner.proto.spire) against the SPIRE Server API
double and the real spire-server (`spire_api`): join tokens with an alias, the alias entry
found by its SPIFFE ID, a job's entry made once and found by its parent, the agent and the
entries removed; admin over the local socket or an admin X509-SVID (the server checked for its
SPIFFE ID, as the controller does), refused otherwise."""

from __future__ import annotations

import datetime as dt

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dynrunner.controller.backends.opensandbox.spire_tls import SpiffeTlsBridge
from dynrunner.doubles.spire._gen.api.server.entry.v1 import entry_pb2
from dynrunner.proto.spire import SpireServerClient, SpireServerError, parse_spiffe_id
from tests.fixtures.spire_server import ADMIN_ID, TRUST_DOMAIN, SpireUnderTest, attest_on

ALIAS = f"spiffe://{TRUST_DOMAIN}/dynrunner/agent/vm/0b6d7d6e-5a8e-4f0e-9a55-3d7c9a6f0c11"


def test_spiffe_ids_are_split_as_the_api_spells_them() -> None:
    parsed = parse_spiffe_id("spiffe://example.org/spire/agent/join_token/abc")
    assert (parsed.trust_domain, parsed.path) == ("example.org", "/spire/agent/join_token/abc")
    assert parse_spiffe_id("spiffe://example.org").path == ""
    for bad in ("https://example.org/x", "spiffe:///x"):
        with pytest.raises(ValueError):
            parse_spiffe_id(bad)


async def test_a_token_with_an_alias_joins_one_agent_that_is_removed_with_its_alias(spire_api: SpireUnderTest) -> None:
    async with grpc.aio.insecure_channel(spire_api.admin_target) as channel:
        client = SpireServerClient(channel)
        await client.probe()
        token = await client.create_join_token(600, agent_id=ALIAS)
        assert token.value and abs((token.expires_at - dt.datetime.now(dt.UTC)).total_seconds() - 600) < 5
        assert token.value not in repr(token)
        [alias] = await client.entries_with_spiffe_id(ALIAS)
        agent_id = f"spiffe://{TRUST_DOMAIN}/spire/agent/join_token/{token.value}"
        assert (alias.spiffe_id, alias.parent_id) == (ALIAS, agent_id)

        assert await client.delete_agent(agent_id) is False  # not attested yet
        async with spire_api.channel(None) as attesting:
            await attest_on(attesting, token.value, ec.generate_private_key(ec.SECP256R1()))
        assert await spire_api.agent_ids() == [agent_id]
        assert await client.delete_agent(agent_id) is True
        assert await spire_api.agent_ids() == []

        assert await client.delete_entries([alias.id, "no-such-entry"]) == [alias.id]
        assert await client.entries_with_spiffe_id(ALIAS) == []
        # probe, create, a listing of 2 pages (SPIRE ends a listing with an empty page), 2
        # DeleteAgent, 1 BatchDeleteEntry, a listing of 1 (empty) page
        assert client.requests == 8


async def test_an_alias_in_spires_reserved_namespace_is_refused(spire_api: SpireUnderTest) -> None:
    """As SPIRE's CreateJoinToken (VerifyTrustDomainWorkloadID): no agent ID under `/spire/`.
    The product's alias lies outside it (`builders.agent_alias`)."""
    async with grpc.aio.insecure_channel(spire_api.admin_target) as channel:
        client = SpireServerClient(channel)
        with pytest.raises(SpireServerError) as refused:
            await client.create_join_token(60, agent_id=f"spiffe://{TRUST_DOMAIN}/spire/agent/dynrunner/vm/a1")
        assert "reserved namespace" in str(refused.value)
        # Not even listed for: SPIRE's ListEntries takes only a workload's ID as its filter.
        with pytest.raises(SpireServerError) as unlisted:
            await client.entries_with_spiffe_id(f"spiffe://{TRUST_DOMAIN}/spire/agent/dynrunner/vm/a1")
        assert unlisted.value.code == "INVALID_ARGUMENT" and "malformed SPIFFE ID filter" in unlisted.value.details
        assert await client.all_entries() == []


async def test_entries_are_listed_across_pages(spire_api: SpireUnderTest) -> None:
    async with grpc.aio.insecure_channel(spire_api.admin_target) as channel:
        client = SpireServerClient(channel)
        for _ in range(3):
            await client.create_join_token(60, agent_id=ALIAS)
        found = await client.entries_with_spiffe_id(ALIAS, page_size=2)
        assert len(found) == 3 and len({e.parent_id for e in found}) == 3


async def test_a_job_entry_is_made_once_and_found_by_its_parent(spire_api: SpireUnderTest) -> None:
    job = f"spiffe://{TRUST_DOMAIN}/ci/owner/repo/build"
    async with grpc.aio.insecure_channel(spire_api.admin_target) as channel:
        client = SpireServerClient(channel)
        made = await client.create_entry(job, ALIAS, [("unix", "uid:1001")], x509_svid_ttl_s=600)
        again = await client.create_entry(job, ALIAS, [("unix", "uid:1001")], x509_svid_ttl_s=600)
        assert again == made and (made.spiffe_id, made.parent_id) == (job, ALIAS)
        admin = spire_api.admin()
        stored = await admin.entry.GetEntry(entry_pb2.GetEntryRequest(id=made.id))
        await admin.channel.close()
        assert [(s.type, s.value) for s in stored.selectors] == [("unix", "uid:1001")]
        assert stored.x509_svid_ttl == 600
        assert await client.entries_with_parent(ALIAS, page_size=1) == [made]
        assert made in await client.all_entries(page_size=1)
        with pytest.raises(SpireServerError) as refused:
            await client.create_entry(job, ALIAS, [])
        assert refused.value.code == "INVALID_ARGUMENT"


async def test_the_admin_rpcs_need_an_admin_svid_over_tcp(spire_api: SpireUnderTest) -> None:
    async with spire_api.channel(ADMIN_ID) as channel:
        client = SpireServerClient(channel)
        await client.probe()
        assert (await client.create_join_token(60, agent_id=ALIAS)).value
    async with spire_api.channel(f"spiffe://{TRUST_DOMAIN}/someone") as channel:
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


async def test_a_server_without_spires_spiffe_id_is_not_trusted(spire_api: SpireUnderTest, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The controller checks the server for `spiffe://<td>/spire/server` (its certificate names
    no host); a certificate of the same CA for any other ID is refused before a byte is sent."""
    cert, key, bundle = spire_api.mint(ADMIN_ID)
    bridge = SpiffeTlsBridge(
        spire_api.address,
        bundle_file=bundle,
        cert_file=cert,
        key_file=key,
        server_id=f"spiffe://{TRUST_DOMAIN}/not/the/server",
    )
    await bridge.start()
    try:
        async with grpc.aio.insecure_channel(bridge.target) as channel:
            client = SpireServerClient(channel, timeout_s=5, attempts=1)
            with pytest.raises(SpireServerError) as refused:
                await client.probe()
        assert refused.value.transient, refused.value
    finally:
        await bridge.aclose()
    async with spire_api.channel(ADMIN_ID) as channel:
        await SpireServerClient(channel).probe()  # the same files, the right ID
