"""A job's SPIFFE identity in Kubernetes: the ClusterStaticEntry that binds it to one Pod.

spire-controller-manager turns each ClusterStaticEntry into a SPIRE registration entry: the
agent named by `parentID` (the one on the Pod's node) issues an X.509 SVID for `spiffeID`
to a workload whose selectors include all of the entry's — here exactly one container of
one Pod (`k8s:pod-uid` never repeats). Pure functions; the backend creates the object once
the Pod has a UID and a node (docs/kubernetes.md, "Identity").
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from dynrunner.controller import contract
from dynrunner.proto.assignment import Assignment

CSE_GROUP = "spire.spiffe.io"
CSE_VERSION = "v1alpha1"
CSE_PLURAL = "clusterstaticentries"
CSE_KIND = "ClusterStaticEntry"
TEMPLATE_FIELDS = frozenset({"trustDomain", "cluster", "nodeUid", "nodeName"})
LABEL_NAMESPACE = "dynrunner.io/namespace"
LABEL_POD_UID = "dynrunner.io/pod-uid"
ANNOTATION_POD = "dynrunner.io/pod"


def template_fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def check_parent_template(template: str) -> str:
    """A `parentIdTemplate` is a SPIFFE ID with `{trustDomain}`, `{cluster}`, `{nodeUid}` and
    `{nodeName}` placeholders (spire-controller-manager's default parent, spelled our way)."""
    try:
        fields = template_fields(template)
    except ValueError as err:
        raise ValueError(f"is not a valid template ({err}); write placeholders as {{nodeUid}}") from None
    unknown = fields - TEMPLATE_FIELDS
    if unknown or "" in fields:
        names = ", ".join(sorted(f"{{{name}}}" for name in unknown)) or "{}"
        raise ValueError(f"uses {names}; the placeholders are {{trustDomain}}, {{cluster}}, {{nodeUid}}, {{nodeName}}")
    if not template.startswith("spiffe://"):
        raise ValueError("must be a SPIFFE ID (spiffe://...)")
    if "nodeUid" not in fields and "nodeName" not in fields:
        raise ValueError(
            "must name the node ({nodeUid} or {nodeName}): the parent is the SPIRE agent on the Pod's node"
        )
    return template


def parent_id(template: str, *, trust_domain: str, cluster: str, node_uid: str, node_name: str) -> str:
    return template.format(trustDomain=trust_domain, cluster=cluster, nodeUid=node_uid, nodeName=node_name)


def selectors(namespace: str, pod_uid: str, container: str) -> list[str]:
    """The narrowest k8s workload attestor selectors: this container of this Pod."""
    return [f"k8s:ns:{namespace}", f"k8s:pod-uid:{pod_uid}", f"k8s:container-name:{container}"]


def expected_spiffe_id(assignment: Assignment, trust_domain: str) -> str:
    """The job's SPIFFE ID derived again from the task (raises ContractError for a job key or
    repository the contract refuses), checked against the one the claimer recorded."""
    owner, repository = contract.repository_of(assignment.task)
    derived = contract.spiffe_id(trust_domain, owner, repository, assignment.job_key)
    if assignment.spiffe_id and assignment.spiffe_id != derived:
        # A pool with refInSpiffeId: the ID also names the task's own ref, derived again here.
        with_ref = contract.spiffe_id(
            trust_domain, owner, repository, assignment.job_key, contract.ref_of(assignment.task)
        )
        if assignment.spiffe_id == with_ref:
            return with_ref
        raise contract.ContractError(
            f"the assignment's SPIFFE ID {assignment.spiffe_id} is not {derived} "
            "(the controller's identity.trustDomain changed since the job was claimed?)"
        )
    return derived


def cluster_static_entry(
    *,
    name: str,
    spiffe_id: str,
    parent: str,
    namespace: str,
    pod_name: str,
    pod_uid: str,
    container: str,
    ttl_s: int,
    labels: Mapping[str, str],
    class_name: str = "",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "spiffeID": spiffe_id,
        "parentID": parent,
        "selectors": selectors(namespace, pod_uid, container),
        "x509SVIDTTL": f"{ttl_s}s",
    }
    if class_name:
        spec["className"] = class_name
    return {
        "apiVersion": f"{CSE_GROUP}/{CSE_VERSION}",
        "kind": CSE_KIND,
        "metadata": {
            "name": name,
            "labels": {**labels, LABEL_NAMESPACE: namespace, LABEL_POD_UID: pod_uid},
            "annotations": {ANNOTATION_POD: f"{namespace}/{pod_name}"},
        },
        "spec": spec,
    }


def same_binding(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether an entry found under our name binds the same identity to the same workload
    (spiffeID, parentID, selectors: spire-controller-manager's entry key)."""
    have, want = existing.get("spec") or {}, wanted["spec"]
    return (
        have.get("spiffeID") == want["spiffeID"]
        and have.get("parentID") == want["parentID"]
        and sorted(have.get("selectors") or []) == sorted(want["selectors"])
    )
