"""The RBAC rules the controller needs, generated from the permissions marked on `KubeApi`'s
methods: docs/kubernetes.md, the Helm chart's Role and `check` all read them from here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dynrunner.controller.backends.kubernetes.api import KubeApi
from dynrunner.controller.backends.kubernetes.permissions import MARK, Permission


def declared(owner: type = KubeApi) -> list[Permission]:
    """Every permission marked on `owner`'s methods (default: `KubeApi`), sorted."""
    found = {getattr(member, MARK) for member in vars(owner).values() if hasattr(member, MARK)}
    return sorted(found)


@dataclass
class Rules:
    """RBAC PolicyRules: `role` for the jobs' namespace, `cluster_role` for the rest."""

    role: list[dict[str, Any]] = field(default_factory=list)
    cluster_role: list[dict[str, Any]] = field(default_factory=list)


def rules(
    namespace: str = "{namespace}", permissions: Iterable[Permission] | None = None, *, identity: bool = True
) -> Rules:
    """The PolicyRules the controller needs, one per (group, resource, names), verbs merged;
    without `identity`, less those only a pool that issues identities needs."""
    grouped: dict[tuple[bool, str, str, tuple[str, ...]], set[str]] = {}
    for permission in declared() if permissions is None else permissions:
        if permission.granted_by_default or (permission.identity and not identity):
            continue
        names = tuple(name.replace("{namespace}", namespace) for name in permission.resource_names)
        key = (permission.namespaced, permission.group, permission.resource, names)
        grouped.setdefault(key, set()).add(permission.verb)
    out = Rules()
    for (namespaced, group, resource, names), verbs in sorted(grouped.items()):
        rule: dict[str, Any] = {"apiGroups": [group], "resources": [resource]}
        if names:
            rule["resourceNames"] = list(names)
        rule["verbs"] = sorted(verbs, key=_VERB_ORDER.index)
        (out.role if namespaced else out.cluster_role).append(rule)
    return out


_VERB_ORDER = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]


def manifests(namespace: str, service_account: str, service_account_namespace: str) -> str:
    """The Role (in the jobs' namespace), ClusterRole and their bindings, as YAML."""
    import yaml

    generated = rules(namespace)
    name = "dynrunner-controller"
    subject = [{"kind": "ServiceAccount", "name": service_account, "namespace": service_account_namespace}]
    rbac = "rbac.authorization.k8s.io/v1"
    documents = [
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": generated.role,
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subject,
        },
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": name}, "rules": generated.cluster_role},
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subject,
        },
    ]
    return yaml.safe_dump_all(documents, sort_keys=False)
