"""Objects are JSON values (dicts, lists, strings, numbers, booleans, None); `clone` copies one
several times faster than `copy.deepcopy`, which matters when every write copies a Pod."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def clone(value: T) -> T:
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list):
        return [clone(v) for v in value]  # type: ignore[return-value]
    return value


def same_except_resource_version(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        if key == "metadata":
            meta_a = {k: v for k, v in value.items() if k != "resourceVersion"}
            meta_b = {k: v for k, v in b[key].items() if k != "resourceVersion"}
            if meta_a != meta_b:
                return False
        elif value != b[key]:
            return False
    return True
