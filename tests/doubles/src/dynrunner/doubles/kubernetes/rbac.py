"""RBAC as the authorizer evaluates PolicyRules (plugin/pkg/auth/authorizer/rbac), for the
requests the API double serves and for SelfSubjectAccessReview.

A rule is a dict like a Role's: `verbs`, `apiGroups`, `resources` (`pods`, `pods/status`,
`*`), optional `resourceNames` and, for a namespaced Role's scope, `namespaces` (our own
shorthand for "bound by a RoleBinding in these namespaces"; absent = cluster-wide).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ALLOW_ALL: tuple[dict[str, Any], ...] = ({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},)


@dataclass(frozen=True)
class Attributes:
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def _has(values: Sequence[str], wanted: str) -> bool:
    return "*" in values or wanted in values


def rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    resources = rule.get("resources") or []
    if not (_has(rule.get("verbs") or [], attrs.verb) and _has(rule.get("apiGroups") or [], attrs.group)):
        return False
    if not (_has(resources, resource) or (attrs.subresource and f"*/{attrs.subresource}" in resources)):
        return False
    names = rule.get("resourceNames") or []
    if names and attrs.name not in names:
        return False
    namespaces = rule.get("namespaces")
    return namespaces is None or attrs.namespace in namespaces


class Authorizer:
    def __init__(
        self, rules: Sequence[dict[str, Any]] = ALLOW_ALL, user: str = "system:serviceaccount:dynrunner:controller"
    ) -> None:
        self.rules = list(rules)
        self.user = user

    def allowed(self, attrs: Attributes) -> bool:
        # Every user may ask what it may do (the system:basic-user ClusterRole).
        if attrs.group == "authorization.k8s.io" and attrs.resource in (
            "selfsubjectaccessreviews",
            "selfsubjectrulesreviews",
        ):
            return True
        return any(rule_allows(rule, attrs) for rule in self.rules)

    def denial(self, attrs: Attributes) -> str:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        return f'User "{self.user}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {scope}'

    def review(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer a SelfSubjectAccessReview: the request echoed with `status.allowed`."""
        spec = body.get("spec") or {}
        ra = spec.get("resourceAttributes")
        if ra is None:
            allowed = bool(spec.get("nonResourceAttributes"))
            reason = ""
        else:
            attrs = Attributes(
                ra.get("verb", ""),
                ra.get("group", ""),
                ra.get("resource", ""),
                ra.get("subresource", ""),
                ra.get("namespace", ""),
                ra.get("name", ""),
            )
            allowed = self.allowed(attrs)
            reason = (
                f'RBAC: allowed by ClusterRoleBinding "dynrunner" of ClusterRole "dynrunner" to User "{self.user}"'
                if allowed
                else ""
            )
        out = dict(body)
        out["metadata"] = {"creationTimestamp": None}
        out["status"] = {"allowed": allowed}
        if reason:
            out["status"]["reason"] = reason
        return out
