"""The garbage collector of kube-controller-manager (pkg/controller/garbagecollector).

- Background: when every owner of a dependent is absent (deleted, or never existed with
  that uid), the dependent is deleted; owners that are absent while others remain are
  removed from its ownerReferences.
- Foreground: an owner carrying the `foregroundDeletion` finalizer has its dependents
  deleted first, then loses the finalizer (and goes).
- Orphan: an owner carrying the `orphan` finalizer has itself removed from its dependents'
  ownerReferences, then loses the finalizer.
- Namespaces (the namespace controller): a deleted namespace is Terminating until every
  object in it is gone (Pods through their kubelet), then it goes too.
- A namespaced dependent's owner is looked up in the dependent's namespace. A
  cluster-scoped dependent that names a namespaced owner kind has an unresolvable reference:
  it is never collected, and a Warning event `OwnerRefInvalidNamespace` names it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from dynrunner.doubles.kubernetes import resources, status
from dynrunner.doubles.kubernetes.events import Recorder
from dynrunner.doubles.kubernetes.resources import Resource
from dynrunner.doubles.kubernetes.store import Event, Obj, Store


class GarbageCollector:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._warned: set[str] = set()
        self._recorder = Recorder(store, "garbage-collector-controller")
        store.listeners.append(self._on_event)

    def _on_event(self, res: Resource, event: Event) -> None:
        meta = event.obj["metadata"]
        if res is resources.NAMESPACES and meta.get("deletionTimestamp") and event.type != "DELETED":
            self._queue.put_nowait(("namespace", meta["name"]))
        elif meta.get("namespace") and event.type == "DELETED":
            self._queue.put_nowait(("namespace", meta["namespace"]))
        if event.type == "DELETED":
            self._queue.put_nowait(("owner-gone", meta["uid"]))
            for ref in meta.get("ownerReferences") or []:
                self._queue.put_nowait(("owner-deleting", ref.get("uid")))
            return
        if meta.get("deletionTimestamp") and {"foregroundDeletion", "orphan"} & set(meta.get("finalizers") or []):
            self._queue.put_nowait(("owner-deleting", meta["uid"]))
        if meta.get("ownerReferences"):
            self._queue.put_nowait(("check", (res, meta.get("namespace", ""), meta["name"])))

    async def run(self) -> None:
        while True:
            kind, arg = await self._queue.get()
            with contextlib.suppress(status.ApiError):
                if kind == "owner-gone":
                    for res, dep in self._store.dependents(arg):
                        self._check(res, dep)
                elif kind == "owner-deleting":
                    self._owner_deleting(arg)
                elif kind == "namespace":
                    self._namespace(arg)
                else:
                    res, ns, name = arg
                    found = self._store.peek(res, ns, name)
                    if found is not None:
                        self._check(res, found)

    def drained(self) -> bool:
        return self._queue.empty()

    def _check(self, res: Resource, dep: Obj) -> None:
        meta = dep["metadata"]
        if meta.get("deletionTimestamp"):
            return
        absent, present, unresolvable = [], [], []
        for ref in meta.get("ownerReferences") or []:
            owner_res = self._store.resource_for_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
            if owner_res is None:
                unresolvable.append(ref)
                continue
            if not res.namespaced and owner_res.namespaced:
                unresolvable.append(ref)
                self._warn(res, dep, ref)
                continue
            owner = self._store.by_uid(ref.get("uid", ""))
            same_ns = owner is not None and (
                not owner_res.namespaced or owner["metadata"].get("namespace") == meta.get("namespace")
            )
            if owner is None or not same_ns or owner["metadata"]["name"] != ref.get("name"):
                absent.append(ref)
            else:
                present.append(ref)
        if not absent:
            return
        if present or unresolvable:
            kept = [r for r in meta.get("ownerReferences") or [] if r not in absent]
            self._store.patch(
                res,
                meta.get("namespace", ""),
                meta["name"],
                "application/merge-patch+json",
                {"metadata": {"ownerReferences": kept}},
            )
            return
        self._store.delete(res, meta.get("namespace", ""), meta["name"], {"propagationPolicy": "Background"})

    def _warn(self, res: Resource, dep: Obj, ref: dict[str, Any]) -> None:
        uid = dep["metadata"]["uid"]
        if uid in self._warned:
            return
        self._warned.add(uid)
        presented = {**dep, "apiVersion": res.api_version, "kind": res.kind}
        message = (
            f"ownerRef [{ref.get('apiVersion')}/{ref.get('kind')}, namespace: , name: {ref.get('name')}, "
            f'uid: {ref.get("uid")}] does not exist in namespace ""'
        )
        self._recorder.event(presented, "Warning", "OwnerRefInvalidNamespace", message)

    def _owner_deleting(self, uid: str) -> None:
        owner = self._store.by_uid(uid)
        if owner is None or not owner["metadata"].get("deletionTimestamp"):
            return
        res = self._store.resource_for_kind(owner.get("apiVersion", ""), owner.get("kind", "")) or self._resource_of(
            uid
        )
        if res is None:
            return
        finalizers = list(owner["metadata"].get("finalizers") or [])
        dependents = self._store.dependents(uid)
        if "orphan" in finalizers:
            for dep_res, dep in dependents:
                kept = [r for r in dep["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                meta = dep["metadata"]
                self._store.patch(
                    dep_res,
                    meta.get("namespace", ""),
                    meta["name"],
                    "application/merge-patch+json",
                    {"metadata": {"ownerReferences": kept}},
                )
            finalizers.remove("orphan")
        elif "foregroundDeletion" in finalizers:
            if dependents:
                for dep_res, dep in dependents:
                    meta = dep["metadata"]
                    if not meta.get("deletionTimestamp"):
                        self._store.delete(
                            dep_res, meta.get("namespace", ""), meta["name"], {"propagationPolicy": "Foreground"}
                        )
                return
            finalizers.remove("foregroundDeletion")
        else:
            return
        meta = owner["metadata"]
        self._store.patch(
            res,
            meta.get("namespace", ""),
            meta["name"],
            "application/merge-patch+json",
            {"metadata": {"finalizers": finalizers}},
        )

    def _namespace(self, name: str) -> None:
        """The namespace controller: a Terminating namespace's content is deleted, then the namespace."""
        ns = self._store.peek(resources.NAMESPACES, "", name)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        left = self._store.namespaced_left(name)
        for res, obj in left:
            if not obj["metadata"].get("deletionTimestamp"):
                with contextlib.suppress(status.ApiError):
                    self._store.delete(res, name, obj["metadata"]["name"], {})
        if not self._store.namespaced_left(name):
            self._store.finalize_namespace(name)

    def _resource_of(self, uid: str) -> Resource | None:
        key = self._store._by_uid.get(uid)
        return next((r for r in self._store.served() if key and r.key() == key[0]), None)
