"""The SPIRE doubles through py-spiffe's WorkloadApiClient and raw gRPC: the security header,
"no identity issued" until an entry matches the caller, SVIDs py-spiffe accepts, rotation
at half the TTL, and ClusterStaticEntries reconciled into entries for a Pod's own process."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from kubernetes import client
from spiffe import SpiffeId, WorkloadApiClient
from spiffe.workloadapi.errors import FetchX509SvidError

from dynrunner.doubles.kubernetes.images import Image
from dynrunner.doubles.spire._gen import workload_pb2 as pb
from dynrunner.doubles.spire.double import SpireOptions
from dynrunner.doubles.spire.entries import Entry
from tests.fixtures.kubernetes import CSE, api_client, cse_body, wait_for

PY = "registry.example/dynrunner/executor:1.0"


def raw_stream(
    socket: str, metadata: tuple[tuple[str, str], ...] = (("workload.spiffe.io", "true"),)
) -> Iterator[pb.X509SVIDResponse]:
    channel = grpc.insecure_channel(f"unix:{socket}")
    call = channel.unary_stream(
        "/SpiffeWorkloadAPI/FetchX509SVID",
        request_serializer=pb.X509SVIDRequest.SerializeToString,
        response_deserializer=pb.X509SVIDResponse.FromString,
    )
    try:
        yield from call(pb.X509SVIDRequest(), metadata=metadata, timeout=10)
    finally:
        channel.close()


def add_entry(
    cluster: Any, spiffe_id: str, selectors: set[tuple[str, str]], ttl: dt.timedelta | None = None, parent: str = ""
) -> Entry:
    agent = cluster.spire.agents["node-a"].agent
    entry = Entry(spiffe_id, parent or agent.spiffe_id, frozenset(selectors), x509_svid_ttl=ttl)
    return cluster.api.call(cluster.spire.entries.put, entry)


def test_the_security_header_is_required(spire_cluster):
    socket = str(spire_cluster.spire.agents["node-a"].socket_path)
    with pytest.raises(grpc.RpcError) as exc:
        next(raw_stream(socket, metadata=()))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert exc.value.details() == "security header missing from request"


def test_no_identity_until_an_entry_matches_the_caller(spire_cluster):
    socket = f"unix://{spire_cluster.spire.agents['node-a'].socket_path}"
    with WorkloadApiClient(socket_path=socket) as workload, pytest.raises(FetchX509SvidError) as exc:
        workload.fetch_x509_svid()
    assert "no identity issued" in str(exc.value) and "PERMISSION_DENIED" in str(exc.value)
    add_entry(spire_cluster, "spiffe://example.org/other", {("unix", "uid:12345")})
    with WorkloadApiClient(socket_path=socket) as workload, pytest.raises(FetchX509SvidError):
        workload.fetch_x509_svid()
    import os

    add_entry(
        spire_cluster, "spiffe://example.org/test/me", {("unix", f"uid:{os.getuid()}")}, ttl=dt.timedelta(minutes=5)
    )
    with WorkloadApiClient(socket_path=socket) as workload:
        svid = workload.fetch_x509_svid()
        bundles = workload.fetch_x509_bundles()
    assert svid.spiffe_id == SpiffeId("spiffe://example.org/test/me")
    lifetime = svid.leaf.not_valid_after_utc - svid.leaf.not_valid_before_utc
    assert dt.timedelta(minutes=5) <= lifetime <= dt.timedelta(minutes=5, seconds=11), (
        "x509SVIDTTL bounds the SVID (10 s backdate)"
    )
    bundle = bundles.get_bundle_for_trust_domain(svid.spiffe_id.trust_domain)
    assert bundle is not None and spire_cluster.spire.ca.certificate in bundle.x509_authorities


def test_an_entry_of_another_agent_does_not_match(spire_cluster):
    import os

    add_entry(
        spire_cluster,
        "spiffe://example.org/elsewhere",
        {("unix", f"uid:{os.getuid()}")},
        parent="spiffe://example.org/spire/agent/k8s_psat/ci/other-node",
    )
    with (
        WorkloadApiClient(socket_path=f"unix://{spire_cluster.spire.agents['node-a'].socket_path}") as workload,
        pytest.raises(FetchX509SvidError),
    ):
        workload.fetch_x509_svid()


def test_svids_rotate_at_half_their_ttl_and_the_stream_ends_when_the_entry_goes(spire_cluster):
    import os

    entry = add_entry(
        spire_cluster, "spiffe://example.org/short", {("unix", f"uid:{os.getuid()}")}, ttl=dt.timedelta(seconds=1)
    )
    stream = raw_stream(str(spire_cluster.spire.agents["node-a"].socket_path))
    first = next(stream)
    second = next(stream)
    assert first.svids[0].spiffe_id == second.svids[0].spiffe_id == "spiffe://example.org/short"
    assert first.svids[0].x509_svid != second.svids[0].x509_svid, "a new SVID before the old one expires"
    spire_cluster.api.call(spire_cluster.spire.entries.delete, entry.id)
    with pytest.raises(grpc.RpcError) as exc:
        for _ in stream:
            pass
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED and exc.value.details() == "no identity issued"


FETCH = """
import json, os, sys
from spiffe import WorkloadApiClient
try:
    with WorkloadApiClient() as client:
        svids = client.fetch_x509_svids()
    out = {"ids": [str(s.spiffe_id) for s in svids]}
except Exception as exc:
    out = {"error": str(exc)}
out["socket"] = os.environ["SPIFFE_ENDPOINT_SOCKET"]
print(json.dumps(out))
"""


def job_pod(name: str) -> dict[str, Any]:
    container = {
        "name": "executor",
        "image": PY,
        "args": ["-c", FETCH],
        "env": [{"name": "SPIFFE_ENDPOINT_SOCKET", "value": "unix:///spiffe-workload-api/spire-agent.sock"}],
        "volumeMounts": [{"name": "spiffe", "mountPath": "/spiffe-workload-api", "readOnly": True}],
    }
    volume = {"name": "spiffe", "csi": {"driver": "csi.spiffe.io", "readOnly": True}}
    return {
        "metadata": {"name": name, "labels": {"app": "job"}},
        "spec": {"restartPolicy": "Never", "containers": [container], "volumes": [volume]},
    }


def cse(name: str, pod: client.V1Pod, node_uid: str, container: str = "executor") -> dict[str, Any]:
    spec = {
        "spiffeID": f"spiffe://example.org/ci/owner/repo/{name}",
        "parentID": f"spiffe://example.org/spire/agent/k8s_psat/ci/{node_uid}",
        "selectors": ["k8s:ns:default", f"k8s:pod-uid:{pod.metadata.uid}", f"k8s:container-name:{container}"],
        "x509SVIDTTL": "10m",
    }
    return cse_body(name, spec)


def run_job(cluster: Any, v1: client.CoreV1Api, name: str, before_start: Any = None) -> dict[str, Any]:
    pod = v1.create_namespaced_pod("default", job_pod(name))
    if before_start:
        before_start(pod)
    wait_for(lambda: v1.read_namespaced_pod(name, "default").status.phase in ("Succeeded", "Failed"), timeout=20)
    log = next((cluster.root / "node-a" / "pods" / pod.metadata.uid / "logs").glob("executor.log")).read_text()
    return json.loads(log.strip().splitlines()[-1])


@pytest.fixture
def job_cluster(kube_cluster_factory) -> Iterator[Any]:
    with kube_cluster_factory(
        images={PY: Image(entrypoint=(sys.executable,))}, spire=SpireOptions(), api={"log_size": 10_000}
    ) as cluster:
        yield cluster


def test_a_pods_process_gets_the_svid_of_its_cluster_static_entry(job_cluster):
    with api_client(job_cluster.api) as api:
        v1, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        node_uid = v1.read_node("node-a").metadata.uid

        def declare(pod: client.V1Pod) -> None:
            custom.create_cluster_custom_object(*CSE, cse("build", pod, node_uid))

        out = run_job(job_cluster, v1, "build", declare)
        assert out["ids"] == ["spiffe://example.org/ci/owner/repo/build"], out
        assert out["socket"].startswith("unix:///tmp/spire-") and out["socket"].endswith("/node-a/spire-agent.sock")


def test_a_pod_without_a_matching_entry_is_denied(job_cluster):
    with api_client(job_cluster.api) as api:
        v1, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        node_uid = v1.read_node("node-a").metadata.uid

        def wrong_container(pod: client.V1Pod) -> None:
            custom.create_cluster_custom_object(*CSE, cse("other", pod, node_uid, container="sidecar"))

        out = run_job(job_cluster, v1, "other", wrong_container)
        assert "no identity issued" in out["error"]


def test_cluster_static_entries_are_reconciled_like_spire_controller_manager(job_cluster):
    spire = job_cluster.spire
    with api_client(job_cluster.api) as api:
        custom = client.CustomObjectsApi(api)
        body = cse_body(
            "a",
            {
                "spiffeID": "spiffe://example.org/a",
                "parentID": "spiffe://example.org/spire/agent/x",
                "selectors": ["k8s:ns:a"],
                "x509SVIDTTL": "90s",
            },
        )
        custom.create_cluster_custom_object(*CSE, body)
        entries = wait_for(lambda: job_cluster.api.call(spire.entries.entries))
        assert [(e.spiffe_id, e.selectors, e.x509_svid_ttl) for e in entries] == [
            ("spiffe://example.org/a", frozenset({("k8s", "ns:a")}), dt.timedelta(seconds=90))
        ]
        # `set` is raised by the pass that created the entry and lowered by the next one.
        wait_for(
            lambda: (
                custom.get_cluster_custom_object(*CSE, "a").get("status")
                == {"rendered": True, "masked": False, "set": False}
            )
        )
        twin = {**body, "metadata": {"name": "b"}}
        custom.create_cluster_custom_object(*CSE, twin)
        wait_for(lambda: custom.get_cluster_custom_object(*CSE, "b").get("status", {}).get("masked"))
        foreign = {**body, "metadata": {"name": "c"}, "spec": {**body["spec"], "spiffeID": "spiffe://elsewhere.org/c"}}
        custom.create_cluster_custom_object(*CSE, foreign)
        undeclared = job_cluster.api.call(
            spire.entries.put,
            Entry("spiffe://example.org/manual", "spiffe://example.org/spire/agent/x", frozenset({("k8s", "ns:b")})),
        )
        job_cluster.api.call(spire.controller_manager.reconcile)
        ids = sorted(e.spiffe_id for e in job_cluster.api.call(spire.entries.entries))
        assert ids == ["spiffe://example.org/a"], "undeclared entries are deleted; foreign trust domains never created"
        assert undeclared.id not in {e.id for e in job_cluster.api.call(spire.entries.entries)}
        custom.delete_cluster_custom_object(*CSE, "a")
        custom.delete_cluster_custom_object(*CSE, "b")
        wait_for(lambda: not job_cluster.api.call(spire.entries.entries))


def test_the_issue_delay_holds_back_new_entries(kube_cluster_factory):
    with kube_cluster_factory(spire=SpireOptions(issue_delay=0.5)) as cluster, api_client(cluster.api) as api:
        custom = client.CustomObjectsApi(api)
        body = cse_body(
            "a",
            {
                "spiffeID": "spiffe://example.org/a",
                "parentID": "spiffe://example.org/spire/agent/x",
                "selectors": ["k8s:ns:a"],
            },
        )
        started = time.monotonic()
        custom.create_cluster_custom_object(*CSE, body)
        wait_for(lambda: cluster.api.call(cluster.spire.entries.entries))
        assert time.monotonic() - started >= 0.5


def test_jwt_svids_for_the_callers_identity_and_their_bundle(spire_cluster):
    """FetchJWTSVID signs for the caller's entry and the audiences asked (py-spiffe validates it
    with the JWKS from FetchJWTBundles); ValidateJWTSVID accepts it for that audience only; a
    request without an audience, or for an identity the caller does not have, is refused."""
    import os

    from spiffe import TrustDomain
    from spiffe.svid.jwt_svid import JwtSvid
    from spiffe.workloadapi.errors import FetchJwtSvidError, ValidateJwtSvidError

    me = "spiffe://example.org/ci/owner/repo/deploy"
    add_entry(spire_cluster, me, {("unix", f"uid:{os.getuid()}")})
    socket = f"unix://{spire_cluster.spire.agents['node-a'].socket_path}"
    with WorkloadApiClient(socket_path=socket) as workload:
        svid = workload.fetch_jwt_svid({"sts.example"}, subject=SpiffeId(me))
        bundle = workload.fetch_jwt_bundles().get_bundle_for_trust_domain(TrustDomain("example.org"))
        assert bundle is not None
        checked = JwtSvid.parse_and_validate(svid.token, bundle, {"sts.example"})
        assert str(checked.spiffe_id) == me and checked.audience == {"sts.example"}
        assert 290 <= checked.expiry - time.time() <= 300, "SPIRE's default JWT-SVID TTL, 5 minutes"
        assert str(workload.validate_jwt_svid(svid.token, "sts.example").spiffe_id) == me
        with pytest.raises(ValidateJwtSvidError, match=r"Audience doesn't match"):
            workload.validate_jwt_svid(svid.token, "vault.example")
        with pytest.raises(FetchJwtSvidError, match="no identity issued"):
            workload.fetch_jwt_svid({"sts.example"}, subject=SpiffeId("spiffe://example.org/ci/owner/repo/other"))
    channel = grpc.insecure_channel(f"unix:{spire_cluster.spire.agents['node-a'].socket_path}")
    call = channel.unary_unary(
        "/SpiffeWorkloadAPI/FetchJWTSVID",
        request_serializer=pb.JWTSVIDRequest.SerializeToString,
        response_deserializer=pb.JWTSVIDResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as exc:
        call(pb.JWTSVIDRequest(), metadata=(("workload.spiffe.io", "true"),), timeout=10)
    channel.close()
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and exc.value.details() == "audience must be specified"
    assert spire_cluster.spire.agents["node-a"].jwt_svids_issued == 1
