"""The official client's create/get/list/replace/patch/delete against the API double, with
kube-apiserver's status codes and Status bodies."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.fixtures.kubernetes import CSE, cse_body


def pod(name: str = "", **meta: Any) -> dict[str, Any]:
    metadata = {"name": name, **meta} if name else {"generateName": "job-", **meta}
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": "executor", "image": "executor:1.0"}], "restartPolicy": "Never"},
    }


def status_of(exc: ApiException) -> dict[str, Any]:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == exc.status
    return body


def test_create_assigns_uid_timestamp_and_increasing_resource_versions(kube_client):
    v1 = client.CoreV1Api(kube_client)
    first = v1.create_namespaced_pod("default", pod())
    second = v1.create_namespaced_pod("default", pod())
    assert first.metadata.name.startswith("job-") and len(first.metadata.name) == len("job-") + 5
    assert first.metadata.uid != second.metadata.uid and first.metadata.creation_timestamp is not None
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert first.status.phase == "Pending" and first.spec.termination_grace_period_seconds == 30
    listed = v1.list_namespaced_pod("default")
    assert int(listed.metadata.resource_version) >= int(second.metadata.resource_version)
    assert v1.read_namespaced_pod(first.metadata.name, "default").metadata.uid == first.metadata.uid


def test_custom_object_create_answers_201_so_the_client_returns_the_body(kube_client):
    custom = client.CustomObjectsApi(kube_client)
    body = cse_body(
        "e1",
        {
            "spiffeID": "spiffe://td/ci/o/r/build",
            "parentID": "spiffe://td/spire/agent/x",
            "selectors": ["k8s:ns:ci"],
            "bogus": 1,
        },
    )
    created = custom.create_cluster_custom_object(*CSE, body)
    assert created["metadata"]["uid"] and created["metadata"]["generation"] == 1
    assert "bogus" not in created["spec"], "unknown fields are pruned by the structural schema"
    assert custom.get_cluster_custom_object(*CSE, "e1")["spec"]["spiffeID"] == "spiffe://td/ci/o/r/build"


def test_not_found_already_exists_and_conflict_are_status_bodies(kube_client):
    v1 = client.CoreV1Api(kube_client)
    with pytest.raises(ApiException) as missing:
        v1.read_namespaced_pod("nope", "default")
    assert missing.value.status == 404
    assert status_of(missing.value)["reason"] == "NotFound"
    assert status_of(missing.value)["details"] == {"name": "nope", "kind": "pods"}
    made = v1.create_namespaced_pod("default", pod("p1"))
    with pytest.raises(ApiException) as dup:
        v1.create_namespaced_pod("default", pod("p1"))
    assert (dup.value.status, status_of(dup.value)["reason"]) == (409, "AlreadyExists")
    assert status_of(dup.value)["message"] == 'pods "p1" already exists'
    v1.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"x": "1"}}})
    stale = made.to_dict()
    with pytest.raises(ApiException) as conflict:
        v1.replace_namespaced_pod("p1", "default", kube_client.sanitize_for_serialization(made))
    assert (conflict.value.status, status_of(conflict.value)["reason"]) == (409, "Conflict")
    assert "the object has been modified" in status_of(conflict.value)["message"]
    del stale
    with pytest.raises(ApiException) as ns:
        v1.create_namespaced_pod("missing-ns", pod("p2"))
    assert ns.value.status == 404 and status_of(ns.value)["message"] == 'namespaces "missing-ns" not found'


def test_invalid_objects_are_422_with_causes(kube_client):
    v1 = client.CoreV1Api(kube_client)
    with pytest.raises(ApiException) as bad_name:
        v1.create_namespaced_pod("default", pod("Bad_Name"))
    body = status_of(bad_name.value)
    assert bad_name.value.status == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    assert body["message"].startswith(
        'Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain'
    )
    with pytest.raises(ApiException) as no_containers:
        v1.create_namespaced_pod("default", {"metadata": {"name": "empty"}, "spec": {"containers": []}})
    assert status_of(no_containers.value)["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers"}
    ]
    custom = client.CustomObjectsApi(kube_client)
    with pytest.raises(ApiException) as cse:
        custom.create_cluster_custom_object(*CSE, {**cse_body("e"), "spec": {}})
    fields = {c["field"] for c in status_of(cse.value)["details"]["causes"]}
    assert fields == {"spec.spiffeID", "spec.parentID", "spec.selectors"}


def test_pod_spec_is_immutable_but_status_goes_through_the_subresource(kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", pod("p"))
    with pytest.raises(ApiException) as exc:
        v1.patch_namespaced_pod("p", "default", {"spec": {"restartPolicy": "Always"}})
    assert exc.value.status == 422 and "pod updates may not change fields" in status_of(exc.value)["message"]
    v1.patch_namespaced_pod("p", "default", {"status": {"phase": "Running"}})
    assert v1.read_namespaced_pod("p", "default").status.phase == "Pending", "status is ignored on the main resource"
    v1.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    assert v1.read_namespaced_pod("p", "default").status.phase == "Running"


def test_patch_formats(kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", pod("p", labels={"a": "1"}, finalizers=["x.io/one"]))
    # The client sends a dict as a strategic merge patch: finalizers are a set, labels merge.
    v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"b": "2"}, "finalizers": ["x.io/two"]}})
    got = v1.read_namespaced_pod("p", "default").metadata
    assert got.labels == {"a": "1", "b": "2"} and got.finalizers == ["x.io/one", "x.io/two"]
    v1.patch_namespaced_pod("p", "default", [{"op": "remove", "path": "/metadata/labels/a"}])
    assert v1.read_namespaced_pod("p", "default").metadata.labels == {"b": "2"}
    v1.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": None}})
    custom = client.CustomObjectsApi(kube_client)
    body = cse_body(
        "e", {"spiffeID": "spiffe://td/a", "parentID": "spiffe://td/b", "selectors": ["k8s:ns:a", "k8s:ns:b"]}
    )
    custom.create_cluster_custom_object(*CSE, body)
    patched = custom.patch_cluster_custom_object(*CSE, "e", {"spec": {"selectors": ["k8s:ns:c"]}})
    assert patched["spec"]["selectors"] == ["k8s:ns:c"], "merge patch replaces lists"
    assert patched["metadata"]["generation"] == 2
    status = custom.patch_cluster_custom_object_status(
        *CSE, "e", {"status": {"rendered": True, "masked": False, "set": True}}
    )
    assert status["status"]["set"] is True


def test_strategic_merge_patch_is_refused_for_custom_resources(kube_api, kube_client):
    custom = client.CustomObjectsApi(kube_client)
    body = cse_body("e", {"spiffeID": "spiffe://td/a", "parentID": "spiffe://td/b", "selectors": ["k8s:ns:a"]})
    custom.create_cluster_custom_object(*CSE, body)
    request = urllib.request.Request(
        f"{kube_api.url}/apis/spire.spiffe.io/v1alpha1/clusterstaticentries/e",
        data=b'{"spec": {"hint": "x"}}',
        method="PATCH",
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(request, timeout=5)
    assert exc.value.code == 415
    assert json.loads(exc.value.read())["reason"] == "UnsupportedMediaType"


def test_delete_returns_the_pod_but_a_status_for_secrets(kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", pod("p"))
    assert v1.delete_namespaced_pod("p", "default").metadata.name == "p"
    v1.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
    gone = v1.delete_namespaced_secret("s", "default")
    assert gone["status"] == "Success" and gone["details"]["name"] == "s" and gone["details"]["kind"] == "secrets"
    with pytest.raises(ApiException) as exc:
        v1.delete_namespaced_secret("s", "default")
    assert exc.value.status == 404


def test_graceful_delete_of_a_scheduled_pod_and_finalizers(kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", pod("p"))
    # An unscheduled Pod is deleted at once (grace 0), whatever the grace asked.
    v1.delete_namespaced_pod("p", "default", grace_period_seconds=30)
    with pytest.raises(ApiException):
        v1.read_namespaced_pod("p", "default")
    v1.create_namespaced_secret("default", {"metadata": {"name": "s", "finalizers": ["x.io/hold"]}})
    pending = v1.delete_namespaced_secret("s", "default")
    assert pending["status"] == "Success"
    held = v1.read_namespaced_secret("s", "default")
    assert held.metadata.deletion_timestamp is not None
    v1.patch_namespaced_secret("s", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(ApiException):
        v1.read_namespaced_secret("s", "default")


def test_graceful_delete_keeps_a_scheduled_pod_until_grace_zero(kube_api, kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", {**pod("p"), "spec": {**pod()["spec"], "nodeName": "node-a"}})
    first = v1.delete_namespaced_pod("p", "default")
    assert first.metadata.deletion_timestamp is not None and first.metadata.deletion_grace_period_seconds == 30
    assert v1.read_namespaced_pod("p", "default").metadata.deletion_timestamp is not None
    v1.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    with pytest.raises(ApiException):
        v1.read_namespaced_pod("p", "default")


def test_list_pagination_with_limit_and_continue(kube_client):
    v1 = client.CoreV1Api(kube_client)
    for i in range(5):
        v1.create_namespaced_pod("default", pod(f"p{i}"))
    first = v1.list_namespaced_pod("default", limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"] and first.metadata.remaining_item_count == 3
    second = v1.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    third = v1.list_namespaced_pod("default", limit=2, _continue=second.metadata._continue)
    assert [p.metadata.name for p in second.items + third.items] == ["p2", "p3", "p4"]
    assert third.metadata._continue is None


def test_discovery_and_crd_reads(kube_client):
    groups = {g.name for g in client.ApisApi(kube_client).get_api_versions().groups}
    assert {"spire.spiffe.io", "apiextensions.k8s.io", "authorization.k8s.io"} <= groups
    crd = client.ApiextensionsV1Api(kube_client).read_custom_resource_definition("clusterstaticentries.spire.spiffe.io")
    assert crd.spec.scope == "Cluster" and crd.spec.names.plural == "clusterstaticentries"
    assert client.VersionApi(kube_client).get_code().major == "1"
    resources = client.CoreV1Api(kube_client).get_api_resources()
    assert {"pods", "pods/status", "secrets", "nodes", "events", "namespaces"} <= {r.name for r in resources.resources}


def test_a_missing_crd_means_its_resources_are_not_served(kube_api_factory):
    from tests.fixtures.kubernetes import CSE, api_client

    with kube_api_factory(crds=[]) as api, api_client(api) as api_c:
        with pytest.raises(ApiException) as exc:
            client.ApiextensionsV1Api(api_c).read_custom_resource_definition("clusterstaticentries.spire.spiffe.io")
        assert exc.value.status == 404
        with pytest.raises(ApiException) as listing:
            client.CustomObjectsApi(api_c).list_cluster_custom_object(*CSE)
        assert listing.value.status == 404


def test_custom_resources_refuse_unconditional_updates(kube_client):
    custom = client.CustomObjectsApi(kube_client)
    created = custom.create_cluster_custom_object(*CSE, cse_body("e"))
    unconditional = {**created, "metadata": {"name": "e"}}
    with pytest.raises(ApiException) as exc:
        custom.replace_cluster_custom_object(*CSE, "e", unconditional)
    assert exc.value.status == 422 and "metadata.resourceVersion" in status_of(exc.value)["message"]
    replaced = custom.replace_cluster_custom_object(*CSE, "e", {**created, "spec": {**created["spec"], "hint": "h"}})
    assert replaced["spec"]["hint"] == "h" and replaced["metadata"]["generation"] == 2


def test_an_immutable_secret_keeps_its_data(kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"k": "v"}, "immutable": True})
    v1.patch_namespaced_secret("s", "default", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ApiException) as exc:
        v1.patch_namespaced_secret("s", "default", {"stringData": {"k": "w"}})
    body = status_of(exc.value)
    assert exc.value.status == 422 and body["details"]["causes"][0]["field"] == "data"
    assert body["message"] == 'Secret "s" is invalid: data: Forbidden: field is immutable when `immutable` is set'
