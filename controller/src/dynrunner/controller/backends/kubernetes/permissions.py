"""The Kubernetes permissions the controller needs, declared once: each method of `KubeApi`
(the one module that talks to Kubernetes) carries the verb and resource it uses, and the RBAC
rules of docs/kubernetes.md (and the Helm chart's Role) are generated from those marks.

Importing this module has no side effects and does not load the Kubernetes client;
`rules()` imports `api` only to read the marks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
MARK = "__kube_permission__"


@dataclass(frozen=True, order=True)
class Permission:
    group: str
    """The API group ("" is the core group)."""
    resource: str
    verb: str
    namespaced: bool = True
    """In the jobs' namespace (a Role) or cluster-wide (a ClusterRole)."""
    resource_names: tuple[str, ...] = ()
    """Restricted to these names; `{namespace}` stands for the pool's namespace."""
    granted_by_default: bool = False
    """Every authenticated user has it (the `system:basic-user` ClusterRole): no rule needed."""


def requires(
    group: str,
    resource: str,
    verb: str,
    *,
    namespaced: bool = True,
    resource_names: tuple[str, ...] = (),
    granted_by_default: bool = False,
) -> Callable[[F], F]:
    """Mark an API method with the permission its request needs."""
    permission = Permission(group, resource, verb, namespaced, resource_names, granted_by_default)

    def mark(method: F) -> F:
        setattr(method, MARK, permission)
        return method

    return mark


def declared(owner: type | None = None) -> list[Permission]:
    """Every permission marked on `owner`'s methods (default: `KubeApi`), sorted."""
    if owner is None:
        from dynrunner.controller.backends.kubernetes.api import KubeApi

        owner = KubeApi
    found = {getattr(member, MARK) for member in vars(owner).values() if hasattr(member, MARK)}
    return sorted(found)


@dataclass
class Rules:
    """RBAC PolicyRules: `role` for the jobs' namespace, `cluster_role` for the rest."""

    role: list[dict[str, Any]] = field(default_factory=list)
    cluster_role: list[dict[str, Any]] = field(default_factory=list)


def rules(namespace: str = "{namespace}", permissions: Iterable[Permission] | None = None) -> Rules:
    """The PolicyRules the controller needs, one per (group, resource, names), verbs merged."""
    grouped: dict[tuple[bool, str, str, tuple[str, ...]], set[str]] = {}
    for permission in declared() if permissions is None else permissions:
        if permission.granted_by_default:
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
