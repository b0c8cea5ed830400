"""Label and field selectors in lists, ownerReference garbage collection, RBAC and
SelfSubjectAccessReview, bearer tokens from a kubeconfig, and injected faults."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client import ApiException

from tests.fixtures.kubernetes import CSE, api_client, cse_body


def pod(name: str, node: str = "", **labels: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i:1"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def eventually(check: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", {"a", "b"}),
        ("app==web", {"a", "b"}),
        ("app!=web", {"c", "d"}),
        ("app in (web,db)", {"a", "b", "c"}),
        ("app notin (web)", {"c", "d"}),
        ("tier", {"a"}),
        ("!tier", {"b", "c", "d"}),
        ("app=web,!tier", {"b"}),
    ],
)
def test_label_selectors(kube_client, selector, expected):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", pod("a", app="web", tier="front"))
    v1.create_namespaced_pod("default", pod("b", app="web"))
    v1.create_namespaced_pod("default", pod("c", app="db"))
    v1.create_namespaced_pod("default", pod("d"))
    assert {p.metadata.name for p in v1.list_namespaced_pod("default", label_selector=selector).items} == expected


def test_field_selectors_and_unsupported_fields(kube_api, kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", pod("a", node="n1"))
    v1.create_namespaced_pod("default", pod("b"))
    v1.create_namespaced_pod("kube-system", pod("c", node="n1"))
    assert {p.metadata.name for p in v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items} == {
        "a",
        "c",
    }
    assert {p.metadata.name for p in v1.list_namespaced_pod("default", field_selector="spec.nodeName=").items} == {"b"}
    assert {
        p.metadata.name for p in v1.list_pod_for_all_namespaces(field_selector="metadata.namespace!=default").items
    } == {"c"}
    assert {
        p.metadata.name
        for p in v1.list_namespaced_pod("default", field_selector="status.phase=Pending,metadata.name=a").items
    } == {"a"}
    with pytest.raises(ApiException) as exc:
        v1.list_namespaced_pod("default", field_selector="spec.image=x")
    assert exc.value.status == 400 and "field label not supported: spec.image" in exc.value.body
    with pytest.raises(ApiException) as bad:
        v1.list_namespaced_pod("default", label_selector="a in ()")
    assert bad.value.status == 400


def test_a_secret_owned_by_a_pod_goes_with_the_pod(kube_client):
    v1 = client.CoreV1Api(kube_client)
    owner = v1.create_namespaced_pod("default", pod("p"))
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner.metadata.uid, "controller": True}
    v1.create_namespaced_secret(
        "default", {"metadata": {"name": "s", "ownerReferences": [ref]}, "stringData": {"a": "b"}}
    )
    time.sleep(0.1)
    assert v1.read_namespaced_secret("s", "default").metadata.name == "s", "an existing owner keeps its dependent"
    v1.delete_namespaced_pod("p", "default")
    eventually(lambda: not v1.list_namespaced_secret("default").items)


def test_a_dependent_of_an_owner_that_never_existed_is_collected(kube_client):
    v1 = client.CoreV1Api(kube_client)
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "00000000-0000-0000-0000-000000000000"}
    v1.create_namespaced_secret("default", {"metadata": {"name": "s", "ownerReferences": [ref]}})
    eventually(lambda: not v1.list_namespaced_secret("default").items)


def test_foreground_deletion_removes_dependents_first(kube_client):
    v1 = client.CoreV1Api(kube_client)
    owner = v1.create_namespaced_secret("default", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "Secret", "name": "owner", "uid": owner.metadata.uid}
    v1.create_namespaced_secret("default", {"metadata": {"name": "dep", "ownerReferences": [ref]}})
    v1.delete_namespaced_secret("owner", "default", propagation_policy="Foreground")
    eventually(lambda: not v1.list_namespaced_secret("default").items)


def test_orphan_deletion_keeps_dependents_without_the_reference(kube_client):
    v1 = client.CoreV1Api(kube_client)
    owner = v1.create_namespaced_secret("default", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "Secret", "name": "owner", "uid": owner.metadata.uid}
    v1.create_namespaced_secret("default", {"metadata": {"name": "dep", "ownerReferences": [ref]}})
    v1.delete_namespaced_secret("owner", "default", propagation_policy="Orphan")
    eventually(lambda: [s.metadata.name for s in v1.list_namespaced_secret("default").items] == ["dep"])
    assert not v1.read_namespaced_secret("dep", "default").metadata.owner_references


def test_a_cluster_scoped_object_owned_by_a_pod_is_never_collected_and_warned_about(kube_client):
    v1 = client.CoreV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    owner = v1.create_namespaced_pod("default", pod("p"))
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner.metadata.uid}
    custom.create_cluster_custom_object(*CSE, cse_body("e", ownerReferences=[ref]))
    v1.delete_namespaced_pod("p", "default")
    eventually(lambda: any(e.reason == "OwnerRefInvalidNamespace" for e in v1.list_namespaced_event("default").items))
    warning = next(e for e in v1.list_namespaced_event("default").items if e.reason == "OwnerRefInvalidNamespace")
    assert (
        warning.type == "Warning"
        and warning.involved_object.name == "e"
        and warning.involved_object.kind == "ClusterStaticEntry"
    )
    time.sleep(0.2)
    assert (
        custom.get_cluster_custom_object("spire.spiffe.io", "v1alpha1", "clusterstaticentries", "e")["metadata"]["name"]
        == "e"
    )


RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods", "secrets"],
        "verbs": ["create", "get", "list", "watch", "delete"],
        "namespaces": ["ci"],
    },
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
]


def review(api: client.ApiClient, **attrs: str) -> bool:
    body = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=client.V1ResourceAttributes(**attrs))
    )
    return bool(client.AuthorizationV1Api(api).create_self_subject_access_review(body).status.allowed)


def test_self_subject_access_review_answers_from_the_rules(kube_api_factory):
    with kube_api_factory(rbac=RULES, namespaces=["default", "ci"]) as api, api_client(api) as c:
        assert review(c, verb="create", resource="pods", namespace="ci")
        assert not review(c, verb="create", resource="pods", namespace="default")
        assert review(c, verb="get", resource="nodes")
        assert not review(c, verb="create", group="spire.spiffe.io", resource="clusterstaticentries")
        with pytest.raises(ApiException) as exc:
            client.CoreV1Api(c).create_namespaced_pod("default", pod("p"))
        assert exc.value.status == 403
        message = json.loads(exc.value.body)["message"]
        assert message.startswith("pods is forbidden: User ")
        assert message.endswith('cannot create resource "pods" in API group "" in the namespace "default"')
        client.CoreV1Api(c).create_namespaced_pod("ci", pod("p"))


def test_bearer_tokens_through_a_kubeconfig(kube_api_factory, tmp_path):
    with kube_api_factory(tokens=["s3cret"]) as api:
        good = config.new_client_from_config(str(api.write_kubeconfig(tmp_path / "good", token="s3cret")))
        assert client.CoreV1Api(good).list_namespace().items
        bad = config.new_client_from_config(str(api.write_kubeconfig(tmp_path / "bad", token="wrong")))
        with pytest.raises(ApiException) as exc:
            client.CoreV1Api(bad).list_namespace()
        assert exc.value.status == 401
        good.close(), bad.close()


def test_injected_errors_and_latency(kube_api, kube_client):
    v1 = client.CoreV1Api(kube_client)
    kube_api.faults.fail(count=2, code=500, method="POST", path="/pods")
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            v1.create_namespaced_pod("default", pod("p"))
        assert exc.value.status == 500 and '"reason":"InternalError"' in exc.value.body
    v1.create_namespaced_pod("default", pod("p"))
    kube_api.faults.latency = 0.2
    started = time.monotonic()
    v1.read_namespaced_pod("p", "default")
    assert time.monotonic() - started >= 0.2


def test_a_deleted_namespace_terminates_until_its_content_is_gone(kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespace({"metadata": {"name": "ci"}})
    v1.create_namespaced_secret("ci", {"metadata": {"name": "s"}})
    v1.create_namespaced_pod("ci", pod("p", node="n1"))  # a scheduled Pod waits for its kubelet
    deleted = v1.delete_namespace("ci")
    assert deleted["status"]["phase"] == "Terminating", "a namespace's delete answers the namespace"
    with pytest.raises(ApiException) as exc:
        v1.create_namespaced_secret("ci", {"metadata": {"name": "t"}})
    assert exc.value.status == 403 and "because it is being terminated" in exc.value.body
    eventually(lambda: v1.read_namespaced_pod("p", "ci").metadata.deletion_timestamp)
    assert not v1.list_namespaced_secret("ci").items
    v1.delete_namespaced_pod("p", "ci", grace_period_seconds=0)  # what its kubelet would do
    eventually(lambda: not [n for n in v1.list_namespace().items if n.metadata.name == "ci"])
    assert not v1.list_namespaced_secret("ci").items
