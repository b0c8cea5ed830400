"""core/v1 Events as client-go's event recorder writes them (record/event.go, events_cache.go):
named `<object>.<hex nanoseconds>`, in the object's namespace (`default` for cluster-scoped
objects), and a repeat of the same reason and message for the same object bumps `count`."""

from __future__ import annotations

import time
from typing import Any

from dynrunner.doubles.kubernetes import resources
from dynrunner.doubles.kubernetes.store import Obj, Store, now


def involved(obj: Obj, field_path: str = "") -> dict[str, Any]:
    meta = obj["metadata"]
    ref = {
        "kind": obj.get("kind", ""),
        "apiVersion": obj.get("apiVersion", ""),
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "resourceVersion": meta.get("resourceVersion", ""),
    }
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    if field_path:
        ref["fieldPath"] = field_path
    return ref


class Recorder:
    def __init__(self, store: Store, component: str, host: str = "") -> None:
        self._store = store
        self._component = component
        self._host = host
        self._seen: dict[tuple[str, str, str, str], tuple[str, str]] = {}

    def event(self, obj: Obj, type_: str, reason: str, message: str, field_path: str = "") -> None:
        ref = involved(obj, field_path)
        namespace = ref.get("namespace") or "default"
        key = (ref["uid"], field_path, reason, message)
        stamp = now()
        if key in self._seen:
            ns, name = self._seen[key]
            current = self._store.peek(resources.EVENTS, ns, name)
            if current is not None:
                updated = {**current, "count": int(current.get("count", 1)) + 1, "lastTimestamp": stamp}
                self._store.update(resources.EVENTS, ns, name, updated)
                return
        name = f"{ref['name']}.{time.time_ns():x}"
        source: dict[str, str] = {"component": self._component}
        if self._host:
            source["host"] = self._host
        self._store.create(
            resources.EVENTS,
            namespace,
            {
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": ref,
                "reason": reason,
                "message": message,
                "source": source,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
                "type": type_,
                "eventTime": None,
                "reportingComponent": self._component,
                "reportingInstance": self._host,
            },
        )
        self._seen[key] = (namespace, name)
