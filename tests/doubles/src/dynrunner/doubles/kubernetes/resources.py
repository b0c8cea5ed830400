"""The resource types the API double serves, as kube-apiserver's discovery describes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Resource:
    """One served resource (a REST collection), keyed by group and plural like the apiserver."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
    # kube-apiserver's registry returns the deleted object for these (pods, custom resources);
    # the others answer a Status of Success (registry/generic `ReturnDeletedObject`).
    returns_deleted_object: bool = False
    # Custom resources accept merge and JSON patches only (415 for strategic merge).
    custom: bool = False
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    field_labels: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """`pods` or `clusterstaticentries.spire.spiffe.io`, as error messages name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

PODS = Resource(
    "",
    "v1",
    "pods",
    "Pod",
    True,
    singular="pod",
    subresources=frozenset({"status", "log"}),
    returns_deleted_object=True,
    field_labels=(
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
)
SECRETS = Resource("", "v1", "secrets", "Secret", True, singular="secret", field_labels=("type",))
NODES = Resource(
    "",
    "v1",
    "nodes",
    "Node",
    False,
    singular="node",
    subresources=frozenset({"status"}),
    field_labels=("spec.unschedulable",),
)
NAMESPACES = Resource(
    "",
    "v1",
    "namespaces",
    "Namespace",
    False,
    singular="namespace",
    subresources=frozenset({"status"}),
    verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
    returns_deleted_object=True,
    field_labels=("status.phase",),
)
EVENTS = Resource(
    "",
    "v1",
    "events",
    "Event",
    True,
    singular="event",
    field_labels=(
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
)
CRDS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    False,
    singular="customresourcedefinition",
    subresources=frozenset({"status"}),
)
SELF_SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io",
    "v1",
    "selfsubjectaccessreviews",
    "SelfSubjectAccessReview",
    False,
    singular="selfsubjectaccessreview",
    verbs=("create",),
)

BUILTIN: tuple[Resource, ...] = (PODS, SECRETS, NODES, NAMESPACES, EVENTS, CRDS, SELF_SUBJECT_ACCESS_REVIEWS)


def from_crd(crd: dict[str, Any]) -> list[Resource]:
    """The served versions of a CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        subresources = frozenset((version.get("subresources") or {}).keys())
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        out.append(
            Resource(
                spec["group"],
                version["name"],
                names["plural"],
                names["kind"],
                spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular", names["kind"].lower()),
                subresources=frozenset(s for s in subresources if s == "status"),
                verbs=_ALL_VERBS,
                returns_deleted_object=True,
                custom=True,
                schema=schema,
            )
        )
    return out
