"""The admin's `podTemplate` merged into the generated Pod, structurally.

Mappings merge key by key (a `null` removes a key); lists whose items Kubernetes identifies
by a key merge item by item, as `kubectl patch --type strategic` does for the core types
(containers, volumes and env by `name`, volume mounts by `mountPath`, ports by
`containerPort`, ...); every other list, and every scalar, is replaced. So a template can
add a sidecar, a volume and its mount, change the executor's resources or add one
environment variable without restating the rest.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "hostAliases": "ip",
}
"""Field name → the key its items are merged by (the patchMergeKey of the core/v1 types)."""


def merge(base: Any, overlay: Any, field: str = "") -> Any:
    """`overlay` merged into a copy of `base` (neither is changed)."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = copy.deepcopy(base)
        for key, value in overlay.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = merge(merged[key], value, key)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    key = MERGE_KEYS.get(field)
    if key and isinstance(base, list) and isinstance(overlay, list) and _keyed(base, key) and _keyed(overlay, key):
        merged_list = [copy.deepcopy(item) for item in base]
        index = {item[key]: i for i, item in enumerate(merged_list)}
        for item in overlay:
            if item[key] in index:
                merged_list[index[item[key]]] = merge(merged_list[index[item[key]]], item)
            else:
                index[item[key]] = len(merged_list)
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(overlay)


def _keyed(items: list[Any], key: str) -> bool:
    return all(isinstance(item, dict) and key in item for item in items)
