"""The SPIRE doubles' pure parts: entry matching (with node aliases), ClusterStaticEntry
rendering and Go durations, and SVIDs that py-spiffe accepts."""

from __future__ import annotations

import datetime as dt

import pytest
from spiffe import SpiffeId, X509Svid

from dynrunner.doubles.spire.ca import TrustDomainCA
from dynrunner.doubles.spire.controller_manager import parse_duration, render
from dynrunner.doubles.spire.entries import Agent, Entry, EntryStore, parse_selector

AGENT = Agent("spiffe://td/spire/agent/k8s_psat/ci/uid-1", frozenset({("k8s_psat", "cluster:ci")}))


async def test_entries_match_a_subset_of_the_workloads_selectors_under_its_agent_or_alias():
    store = EntryStore("td")
    mine = store.put(Entry("spiffe://td/a", AGENT.spiffe_id, frozenset({("k8s", "ns:a"), ("k8s", "pod-uid:1")})))
    store.put(Entry("spiffe://td/b", "spiffe://td/spire/agent/k8s_psat/ci/uid-2", frozenset({("k8s", "ns:a")})))
    store.put(Entry("spiffe://td/narrow", AGENT.spiffe_id, frozenset({("k8s", "ns:a"), ("k8s", "container-name:x")})))
    store.put(Entry("spiffe://td/alias", store.server_id, frozenset({("k8s_psat", "cluster:ci")})))
    via_alias = store.put(Entry("spiffe://td/c", "spiffe://td/alias", frozenset({("k8s", "ns:a")})))
    found = store.match(AGENT, {("k8s", "ns:a"), ("k8s", "pod-uid:1"), ("k8s", "container-name:y")})
    assert {e.id for e in found} == {mine.id, via_alias.id}


def test_selectors_split_on_the_first_colon():
    assert parse_selector("k8s:pod-label:app:web") == ("k8s", "pod-label:app:web")
    with pytest.raises(ValueError):
        parse_selector("k8s")


def test_go_durations():
    assert parse_duration("1h30m") == dt.timedelta(minutes=90)
    assert parse_duration("1.5s") == dt.timedelta(seconds=1.5)
    with pytest.raises(ValueError):
        parse_duration("10 minutes")


def test_render_a_cluster_static_entry():
    spec = {
        "spiffeID": "spiffe://td/ci/o/r/build",
        "parentID": "spiffe://td/spire/agent/x",
        "selectors": ["k8s:ns:ci"],
        "x509SVIDTTL": "5m",
    }
    entry = render({"metadata": {"name": "e"}, "spec": spec})
    assert entry.selectors == frozenset({("k8s", "ns:ci")}) and entry.x509_svid_ttl == dt.timedelta(minutes=5)
    with pytest.raises(ValueError):
        render({"metadata": {"name": "e"}, "spec": {**spec, "spiffeID": "spiffe://td/bad path"}})


def test_py_spiffe_accepts_the_svids():
    ca = TrustDomainCA("td")
    svid = ca.sign("spiffe://td/ci/o/r/job", dt.timedelta(minutes=2))
    parsed = X509Svid.parse_raw(svid.chain_der, svid.key_der)
    assert parsed.spiffe_id == SpiffeId("spiffe://td/ci/o/r/job")
    assert svid.rotate_at() == svid.not_before + (svid.not_after - svid.not_before) / 2


def test_an_agent_serves_entries_parented_on_its_join_token_alias():
    """CreateJoinToken's agent_id makes an entry parented on the agent whose SPIFFE ID is the
    alias; entries parented on the alias are the agent's too (SPIRE's authorized entries are
    the agent's children and their descendants)."""
    store = EntryStore("example.org")
    agent = Agent("spiffe://example.org/spire/agent/join_token/t1")
    alias = "spiffe://example.org/dynrunner/agent/vm/a1"
    store.put(Entry(alias, agent.spiffe_id, frozenset({("spiffe_id", agent.spiffe_id)})))
    job = store.put(Entry("spiffe://example.org/ci/o/r/build", alias, frozenset({("unix", "uid:1001")})))
    other = Agent("spiffe://example.org/spire/agent/join_token/t2")
    assert store.match(agent, [("unix", "uid:1001")]) == [job]
    assert store.match(other, [("unix", "uid:1001")]) == []
