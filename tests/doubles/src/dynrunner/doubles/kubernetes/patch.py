"""The three PATCH formats kube-apiserver accepts (server-side apply is not modelled).

- `application/merge-patch+json`: RFC 7386 (null deletes, lists replaced whole).
- `application/json-patch+json`: RFC 6902 (add, remove, replace, move, copy, test).
- `application/strategic-merge-patch+json`: k8s.io/apimachinery/pkg/util/strategicpatch with
  the merge keys of the core/v1 types this double serves (containers by `name`, `env` by
  `name`, `volumeMounts` by `mountPath`, `conditions` by `type`, `ownerReferences` by `uid`,
  `metadata.finalizers` as a set) and the directives `$patch: replace|delete|merge`,
  `$deleteFromPrimitiveList/<field>`, `$retainKeys` and `$setElementOrder/<field>`.
  Custom resources reject it with 415, as kube-apiserver does.
"""

from __future__ import annotations

from typing import Any

from dynrunner.doubles.kubernetes.objects import clone
from dynrunner.doubles.kubernetes.status import ApiError, bad_request

MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "addresses": "type",
    "resourceClaims": "name",
}
PRIMITIVE_SETS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return clone(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: clone(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    current = list(current or [])
    if field in PRIMITIVE_SETS:
        return current + [v for v in patch if v not in current]
    key = MERGE_KEYS.get(field)
    if key is None:
        return [item for item in clone(patch) if not (isinstance(item, dict) and item.get("$patch"))]
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [item for item in clone(patch) if not (isinstance(item, dict) and "$patch" in item)]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {key}")
        index = next((i for i, old in enumerate(current) if isinstance(old, dict) and old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                current.pop(index)
            continue
        if index is None:
            current.append(strategic_merge_patch({}, item))
        else:
            current[index] = strategic_merge_patch(current[index], item)
    return current


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(
            f"the server rejected our request due to an error in our request: invalid JSON pointer {path!r}"
        )
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def json_patch(doc: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = clone(doc)
    for op in operations:
        try:
            doc = _apply_op(doc, op)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request: "
                f"{op.get('op')} operation failed: {exc}",
            ) from exc
    return doc


def _get(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, parts = op["op"], _pointer(op["path"])
    if kind == "test":
        if _get(doc, parts) != op["value"]:
            raise ValueError(f"testing value {op['path']} failed")
        return doc
    if kind in ("move", "copy"):
        value = clone(_get(doc, _pointer(op["from"])))
        if kind == "move":
            doc = _apply_op(doc, {"op": "remove", "path": op["from"]})
        return _apply_op(doc, {"op": "add", "path": op["path"], "value": value})
    if not parts:
        return clone(op.get("value")) if kind != "remove" else None
    parent, last = _parent(doc, parts)
    if kind == "add":
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), clone(op["value"]))
        else:
            parent[last] = clone(op["value"])
    elif kind == "remove":
        if isinstance(parent, list):
            parent.pop(int(last))
        else:
            del parent[last]
    elif kind == "replace":
        if isinstance(parent, list):
            parent[int(last)] = clone(op["value"])
        else:
            if last not in parent:
                raise KeyError(f"replace operation does not apply: doc is missing key: {op['path']}")
            parent[last] = clone(op["value"])
    else:
        raise ValueError(f"unexpected kind: {kind}")
    return doc
