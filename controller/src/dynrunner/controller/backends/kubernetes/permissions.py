"""The Kubernetes permissions the controller needs, declared once: each method of `KubeApi`
(the one module that talks to Kubernetes) carries the verb and resource it uses, and the RBAC
rules of docs/kubernetes.md (and the Helm chart's Role) are generated from those marks.

The marks live here; `rbac` reads them off `KubeApi` (this module imports no client).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
    identity: bool = False
    """Needed only by a pool that issues identities (ClusterStaticEntries, the Nodes their
    parent IDs name, the entries' CRD): not granted while no pool does."""


def requires(
    group: str,
    resource: str,
    verb: str,
    *,
    namespaced: bool = True,
    resource_names: tuple[str, ...] = (),
    granted_by_default: bool = False,
    identity: bool = False,
) -> Callable[[F], F]:
    """Mark an API method with the permission its request needs."""
    permission = Permission(group, resource, verb, namespaced, resource_names, granted_by_default, identity)

    def mark(method: F) -> F:
        setattr(method, MARK, permission)
        return method

    return mark
