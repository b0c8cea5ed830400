"""Discovery documents (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`)
in the shape kube-apiserver serves them, derived from the served resources."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from dynrunner.doubles.kubernetes.resources import Resource

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions() -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def api_groups(served: list[Resource]) -> dict[str, Any]:
    versions: dict[str, list[str]] = defaultdict(list)
    for res in served:
        if res.group and res.version not in versions[res.group]:
            versions[res.group].append(res.version)
    groups = []
    for group, vs in sorted(versions.items()):
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in vs]
        groups.append({"name": group, "versions": entries, "preferredVersion": entries[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def resource_list(group_version: str, served: list[Resource]) -> dict[str, Any]:
    out = []
    for res in served:
        if res.api_version != group_version:
            continue
        out.append(
            {
                "name": res.plural,
                "singularName": res.singular,
                "namespaced": res.namespaced,
                "kind": res.kind,
                "verbs": list(res.verbs),
            }
        )
        out.extend(
            {
                "name": f"{res.plural}/{sub}",
                "singularName": "",
                "namespaced": res.namespaced,
                "kind": res.kind,
                "verbs": ["get", "patch", "update"],
            }
            for sub in sorted(res.subresources)
        )
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": out}
