"""What `dynrunner-controller check` verifies of a kubernetes pool, read-only: the API answers,
the namespace exists, Kubernetes allows every request the controller makes (one
SelfSubjectAccessReview per declared permission), and the ClusterStaticEntry CRD is
installed (when the pool issues identities)."""

from __future__ import annotations

from dataclasses import dataclass

from dynrunner.controller.backends.kubernetes.api import KubeApi, KubeError, NotFound
from dynrunner.controller.backends.kubernetes.identity import CSE_VERSION
from dynrunner.controller.backends.kubernetes.permissions import Permission
from dynrunner.controller.backends.kubernetes.rbac import declared


@dataclass(frozen=True, slots=True)
class Finding:
    ok: bool
    what: str
    detail: str


async def check(api: KubeApi, namespace: str, *, identity: bool) -> list[Finding]:
    try:
        version = await api.server_version()
    except KubeError as err:
        return [Finding(False, "kubernetes API", f"{api.host} does not answer: {err}")]
    found = [Finding(True, "kubernetes API", f"{api.host}, Kubernetes {version}")]
    try:
        await api.get_namespace(namespace)
        found.append(Finding(True, "namespace", f"{namespace} exists"))
    except NotFound:
        found.append(Finding(False, "namespace", f"{namespace} does not exist; create it (kubectl create namespace)"))
    except KubeError as err:
        found.append(Finding(False, "namespace", f"{namespace} cannot be read: {err}"))
    found.append(await _permissions(api, namespace, identity))
    if identity:
        found.append(await _crd(api))
    return found


async def _permissions(api: KubeApi, namespace: str, identity: bool) -> Finding:
    missing = []
    needed = [p for p in declared() if not p.granted_by_default and (identity or not p.identity)]
    for permission in needed:
        names = [n.replace("{namespace}", namespace) for n in permission.resource_names] or [""]
        for name in names:
            allowed, reason = await api.may(
                permission.verb,
                permission.group,
                permission.resource,
                namespace=namespace if permission.namespaced else "",
                name=name,
            )
            if not allowed:
                missing.append(_spell(permission, name) + (f" ({reason})" if reason else ""))
    if missing:
        return Finding(False, "RBAC", "not allowed: " + "; ".join(missing) + " — see docs/kubernetes.md, RBAC")
    return Finding(True, "RBAC", f"all {len(needed)} permissions the controller uses are granted")


def _spell(permission: Permission, name: str) -> str:
    resource = f"{permission.resource}.{permission.group}" if permission.group else permission.resource
    return f"{permission.verb} {resource}" + (f"/{name}" if name else "")


async def _crd(api: KubeApi) -> Finding:
    try:
        crd = await api.get_entry_definition()
    except NotFound:
        return Finding(
            False,
            "ClusterStaticEntry CRD",
            "not installed: install spire-controller-manager (its CRDs), see docs/kubernetes.md",
        )
    except KubeError as err:
        return Finding(False, "ClusterStaticEntry CRD", f"cannot be read: {err}")
    served = [v.get("name") for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served")]
    if CSE_VERSION not in served:
        return Finding(False, "ClusterStaticEntry CRD", f"installed, but {CSE_VERSION} is not served ({served})")
    return Finding(True, "ClusterStaticEntry CRD", f"installed ({CSE_VERSION} served)")
