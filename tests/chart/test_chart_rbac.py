"""The chart's Role and ClusterRole grant exactly what the controller's Kubernetes API module
declares (`rbac.declared()`, one mark per method): Pods, Secrets and Events in each
pool's namespace, the pools' namespaces cluster-wide and, only while some kubernetes pool issues
identities, ClusterStaticEntries, Nodes and the entries' CRD — nothing more, nothing less, for
every values file."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import yaml

from dynrunner.controller.backends.kubernetes import rbac
from tests.fixtures.chart import VALUES_FILES, Chart, find, one


@functools.cache
def rendered(chart: Chart, values: str) -> list[dict[str, Any]]:
    return chart.render([values])


def kubernetes_pools(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    config = yaml.safe_load(one(objects, "ConfigMap", "-controller")["data"]["config.yaml"])
    return [p for p in config["pools"] if p["backend"]["kind"] == "kubernetes"]


def namespaces_of_pools(objects: list[dict[str, Any]]) -> list[str]:
    return sorted({p["backend"]["namespace"] for p in kubernetes_pools(objects)})


def cluster_rules(namespaces: list[str], identity: bool = True) -> list[dict[str, Any]]:
    """What the code declares cluster-wide, for pools in `namespaces` (with `identity`: some of
    them issue identities): the rules of each, the names of the same rule joined."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for namespace in namespaces:
        for rule in rbac.rules(namespace, identity=identity).cluster_role:
            key = (tuple(rule["apiGroups"]), tuple(rule["resources"]), tuple(rule["verbs"]))
            if key in merged and "resourceNames" in rule:
                merged[key]["resourceNames"] = sorted({*merged[key]["resourceNames"], *rule["resourceNames"]})
            else:
                merged[key] = dict(rule)
    return sorted(merged.values(), key=repr)


@pytest.mark.parametrize("values", VALUES_FILES)
def test_the_roles_grant_exactly_what_the_code_declares(chart: Chart, values: str) -> None:
    objects = rendered(chart, values)
    namespaces = namespaces_of_pools(objects)
    assert namespaces
    roles = find(objects, "Role", "-controller")
    assert sorted(r["metadata"]["namespace"] for r in roles) == namespaces
    for role in roles:
        assert role["rules"] == rbac.rules(role["metadata"]["namespace"]).role
    cluster_role = one(objects, "ClusterRole", "-controller")
    identity = any(p["backend"].get("identity", True) for p in kubernetes_pools(objects))
    assert sorted(cluster_role["rules"], key=repr) == cluster_rules(namespaces, identity)


IDENTITY_RESOURCES = {"clusterstaticentries", "nodes", "customresourcedefinitions"}


def test_identity_permissions_are_granted_only_while_a_pool_issues_identities(chart: Chart) -> None:
    """A cluster without SPIRE (every pool `identity: false`) grants the controller no Nodes,
    no ClusterStaticEntries and nothing of their CRD; one pool with identity brings them back."""
    without = {"kubernetesDefaults": {"identity": False}}
    objects = chart.render(["ci/two-pools-values.yaml"], overlay=without)
    (namespaces_rule,) = one(objects, "ClusterRole", "-controller")["rules"]
    assert namespaces_rule["resources"] == ["namespaces"]
    assert namespaces_rule["resourceNames"] == ["ci-jobs", "ci-large"]
    rules = one(rendered(chart, "ci/two-pools-values.yaml"), "ClusterRole")["rules"]
    granted = {resource for rule in rules for resource in rule["resources"]}
    assert granted >= IDENTITY_RESOURCES  # pool "pod" has identity, "large" has not
    assert {p.resource for p in rbac.declared() if p.identity} == IDENTITY_RESOURCES


def test_the_declared_permissions_are_the_backends_requests() -> None:
    """What the rules above are made of: Pods, Secrets and Events in the jobs' namespace; the
    cluster-scoped entries and Nodes; `check`'s reads."""
    declared = {(p.resource, p.verb, p.namespaced) for p in rbac.declared() if not p.granted_by_default}
    assert ("pods", "create", True) in declared and ("secrets", "patch", True) in declared
    assert ("events", "watch", True) in declared
    assert ("clusterstaticentries", "create", False) in declared and ("nodes", "get", False) in declared
    assert not any(verb in ("update", "deletecollection", "escalate", "bind", "*") for _, verb, _ in declared)


def test_bindings_give_the_roles_to_the_controllers_service_account(chart: Chart) -> None:
    objects = rendered(chart, "ci/two-pools-values.yaml")
    account = one(objects, "ServiceAccount", "-controller")
    subject = [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "ci"}]
    for binding in find(objects, "RoleBinding", "-controller"):
        assert binding["subjects"] == subject
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": binding["metadata"]["name"],
        }
    cluster_binding = one(objects, "ClusterRoleBinding", "-controller")
    assert cluster_binding["subjects"] == subject
    assert cluster_binding["roleRef"]["name"] == one(objects, "ClusterRole", "-controller")["metadata"]["name"]
    deployment = one(objects, "Deployment", "-controller")["spec"]["template"]["spec"]
    assert deployment["serviceAccountName"] == account["metadata"]["name"]
    assert deployment["automountServiceAccountToken"] is True
    assert account["automountServiceAccountToken"] is False


def test_two_pools_in_two_namespaces_get_a_role_each_and_one_cluster_role(chart: Chart) -> None:
    objects = rendered(chart, "ci/two-pools-values.yaml")
    assert sorted(r["metadata"]["namespace"] for r in find(objects, "Role")) == ["ci-jobs", "ci-large"]
    (namespaces_rule,) = [r for r in one(objects, "ClusterRole")["rules"] if r["resources"] == ["namespaces"]]
    assert namespaces_rule["resourceNames"] == ["ci-jobs", "ci-large"]


def test_no_rbac_without_kubernetes_pools(chart: Chart) -> None:
    local = {"config": {"pools": [{"name": "local", "labels": ["self-hosted", "local"], "backend": {"kind": "local"}}]}}
    objects = chart.render(["ci/minimal-values.yaml"], overlay=local)
    assert not find(objects, "Role") and not find(objects, "ClusterRole")
    assert not find(objects, "NetworkPolicy", "-executors")
    pod = one(objects, "Deployment", "-controller")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
