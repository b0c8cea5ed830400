"""The API double's object store: etcd plus the generic registry of kube-apiserver.

One global, monotonically increasing resourceVersion (etcd's revision) stamps every write;
a bounded log of write events per resource serves watches from a resourceVersion (older
than the log: 410 Expired, as after an etcd compaction). Objects are JSON dicts; callers
always get copies. All methods run on the double's event loop thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynrunner.doubles.kubernetes import resources, status, validation
from dynrunner.doubles.kubernetes.objects import clone, same_except_resource_version
from dynrunner.doubles.kubernetes.patch import json_patch, merge_patch, strategic_merge_patch
from dynrunner.doubles.kubernetes.resources import Resource

Obj = dict[str, Any]
Match = Callable[[Mapping[str, Any]], bool]
ObjKey = tuple[tuple[str, str], str, str]  # (resource key, namespace, name)


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _in(seconds: int) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None = None


@dataclass
class Watcher:
    """One open watch (or an in-process subscription) with its filter."""

    resource: Resource
    namespace: str | None
    match: Match
    queue: asyncio.Queue[Event | status.ApiError | None] = field(default_factory=asyncio.Queue)

    def offer(self, event: Event) -> None:
        if self.namespace and event.obj["metadata"].get("namespace") != self.namespace:
            return
        now_in = self.match(event.obj)
        was_in = event.old is not None and self.match(event.old)
        if event.type == "MODIFIED" and now_in != was_in:
            # kube-apiserver's cacheWatcher turns a MODIFIED across the selector boundary
            # into ADDED or DELETED, so a filtered watcher sees a consistent set.
            self.queue.put_nowait(
                Event(event.rv, "ADDED" if now_in else "DELETED", event.obj if now_in else event.old or event.obj)
            )
        elif now_in or (event.type == "DELETED" and was_in):
            self.queue.put_nowait(event)

    def close(self, error: status.ApiError | None = None) -> None:
        if error is not None:
            self.queue.put_nowait(error)
        self.queue.put_nowait(None)


class Store:
    def __init__(self, log_size: int = 10_000) -> None:
        self.revision = 1000
        self._resources: dict[tuple[str, str, str], Resource] = {}
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = defaultdict(dict)
        self._logs: dict[tuple[str, str], deque[Event]] = {}
        self._compacted: dict[tuple[str, str], int] = defaultdict(int)
        self._log_size = log_size
        self._watchers: dict[tuple[str, str], list[Watcher]] = defaultdict(list)
        self._by_uid: dict[str, ObjKey] = {}
        self._dependents: dict[str, set[ObjKey]] = defaultdict(set)
        # In-process controllers (garbage collector) hear every write synchronously.
        self.listeners: list[Callable[[Resource, Event], None]] = []
        for res in resources.BUILTIN:
            self.register(res)

    # --- resource types -------------------------------------------------------------
    def register(self, res: Resource) -> None:
        self._resources[(res.group, res.version, res.plural)] = res
        self._logs.setdefault(res.key(), deque(maxlen=self._log_size))

    def unregister_group_resource(self, group: str, plural: str) -> None:
        for key in [k for k in self._resources if k[0] == group and k[2] == plural]:
            del self._resources[key]

    def resource(self, group: str, version: str, plural: str) -> Resource | None:
        return self._resources.get((group, version, plural))

    def served(self) -> list[Resource]:
        return list(self._resources.values())

    def resource_for_kind(self, api_version: str, kind: str) -> Resource | None:
        group = api_version.rpartition("/")[0]
        return next((r for r in self._resources.values() if r.group == group and r.kind == kind), None)

    # --- reads ----------------------------------------------------------------------
    def _bucket(self, res: Resource) -> dict[tuple[str, str], Obj]:
        return self._objects[res.key()]

    def peek(self, res: Resource, namespace: str, name: str) -> Obj | None:
        """The stored object itself (no copy) for in-process readers that do not mutate."""
        return self._bucket(res).get((namespace if res.namespaced else "", name))

    def get(self, res: Resource, namespace: str, name: str) -> Obj:
        obj = self.peek(res, namespace, name)
        if obj is None:
            raise status.not_found(res, name)
        return self._present(res, obj)

    def list_objects(self, res: Resource, namespace: str | None, match: Match) -> tuple[list[Obj], int]:
        items = [
            obj
            for (ns, _), obj in sorted(self._bucket(res).items())
            if (not namespace or not res.namespaced or ns == namespace) and match(obj)
        ]
        return [self._present(res, obj) for obj in items], self.revision

    def by_uid(self, uid: str) -> Obj | None:
        key = self._by_uid.get(uid)
        return self._objects[key[0]].get((key[1], key[2])) if key else None

    def dependents(self, uid: str) -> list[tuple[Resource, Obj]]:
        out = []
        for res_key, ns, name in list(self._dependents.get(uid, ())):
            obj = self._objects[res_key].get((ns, name))
            res = next((r for r in self._resources.values() if r.key() == res_key), None)
            if obj is not None and res is not None:
                out.append((res, obj))
        return out

    def objects(self, res: Resource) -> Iterator[Obj]:
        return iter(list(self._bucket(res).values()))

    @staticmethod
    def _present(res: Resource, obj: Obj) -> Obj:
        out = clone(obj)
        out["apiVersion"], out["kind"] = res.api_version, res.kind
        return out

    # --- writes ---------------------------------------------------------------------
    def _emit(self, res: Resource, type_: str, obj: Obj, old: Obj | None = None) -> None:
        event = Event(int(obj["metadata"]["resourceVersion"]), type_, self._present(res, obj), old)
        log = self._logs[res.key()]
        if len(log) == log.maxlen:
            self._compacted[res.key()] = log[0].rv
        log.append(event)
        for watcher in list(self._watchers[res.key()]):
            watcher.offer(event)
        for listener in self.listeners:
            listener(res, event)

    def _index(self, res: Resource, obj: Obj, add: bool) -> None:
        meta = obj["metadata"]
        key: ObjKey = (res.key(), meta.get("namespace", ""), meta["name"])
        if add:
            self._by_uid[meta["uid"]] = key
        else:
            self._by_uid.pop(meta["uid"], None)
        for ref in meta.get("ownerReferences") or []:
            deps = self._dependents[ref.get("uid", "")]
            deps.add(key) if add else deps.discard(key)

    def _next_rv(self) -> str:
        self.revision += 1
        return str(self.revision)

    def create(self, res: Resource, namespace: str, body: Obj) -> Obj:
        obj = clone(body)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise status.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
            ns = self.peek(resources.NAMESPACES, "", namespace)
            if ns is None:
                raise status.ApiError(
                    404, "NotFound", f'namespaces "{namespace}" not found', {"name": namespace, "kind": "namespaces"}
                )
            if ns["status"].get("phase") == "Terminating":
                raise status.forbidden(
                    res.group_resource,
                    meta.get("name", ""),
                    f"unable to create new content in namespace {namespace} because it is being terminated",
                    res.group,
                    res.plural,
                )
        else:
            meta.pop("namespace", None)
        name = validation.assign_name(res, obj)
        for server_field in (
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ):
            meta.pop(server_field, None)
        if res.custom and "status" in res.subresources:
            obj.pop("status", None)  # PrepareForCreate: status is written through /status only
        validation.admit(res, obj, creating=True)
        if (meta.get("namespace", ""), name) in self._bucket(res):
            raise status.already_exists(res, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        meta["resourceVersion"] = self._next_rv()
        if res.custom or res.plural == "customresourcedefinitions":
            meta["generation"] = 1
        obj.pop("apiVersion", None), obj.pop("kind", None)
        self._bucket(res)[(meta.get("namespace", ""), name)] = obj
        self._index(res, obj, add=True)
        if res.plural == "customresourcedefinitions":
            for served in resources.from_crd(obj):
                self.register(served)
        self._emit(res, "ADDED", obj)
        return self._present(res, obj)

    def update(self, res: Resource, namespace: str, name: str, body: Obj, subresource: str = "") -> Obj:
        key = (namespace if res.namespaced else "", name)
        old = self._bucket(res).get(key)
        if old is None:
            raise status.not_found(res, name)
        new = clone(body)
        new.pop("apiVersion", None), new.pop("kind", None)
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise status.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        wanted = meta.get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise status.conflict(res, name, status.STALE)
        if subresource == "status":
            merged = clone(old)
            merged["status"] = new.get("status", {})
            new = merged
        else:
            if "status" in res.subresources:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = clone(old["status"])
            for server_field in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
            ):
                if server_field in old["metadata"]:
                    meta[server_field] = old["metadata"][server_field]
                else:
                    meta.pop(server_field, None)
            meta["name"] = name
            validation.admit(res, new, creating=False)
            if res is resources.PODS:
                validation.immutable_pod_spec(old, new)
            elif res is resources.SECRETS:
                validation.immutable_secret(old, new)
            if "generation" in old["metadata"]:
                meta["generation"] = old["metadata"]["generation"] + (1 if _spec_of(old) != _spec_of(new) else 0)
        if _same(old, new):
            return self._present(res, old)
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._index(res, old, add=False)
        if (
            new["metadata"].get("deletionTimestamp")
            and not new["metadata"].get("finalizers")
            and not self._grace_pending(res, new)
        ):
            self._remove(res, key, new)
            return self._present(res, new)
        self._bucket(res)[key] = new
        self._index(res, new, add=True)
        self._emit(res, "MODIFIED", new, self._present(res, old))
        return self._present(res, new)

    def patch(
        self, res: Resource, namespace: str, name: str, content_type: str, body: Any, subresource: str = ""
    ) -> Obj:
        current = self.get(res, namespace, name)
        if content_type.startswith("application/merge-patch+json"):
            new = merge_patch(current, body)
        elif content_type.startswith("application/json-patch+json"):
            new = json_patch(current, body)
        elif content_type.startswith("application/strategic-merge-patch+json") and not res.custom:
            new = strategic_merge_patch(current, body)
        else:
            raise status.unsupported_media_type(
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            )
        if not isinstance(new, dict):
            raise status.bad_request("the patch did not produce an object")
        return self.update(res, namespace, name, new, subresource)

    @staticmethod
    def _grace_pending(res: Resource, obj: Obj) -> bool:
        return res is resources.PODS and int(obj["metadata"].get("deletionGracePeriodSeconds") or 0) > 0

    def _remove(self, res: Resource, key: tuple[str, str], obj: Obj) -> None:
        self._bucket(res).pop(key, None)
        self._index(res, obj, add=False)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        if res.plural == "customresourcedefinitions":
            spec = obj["spec"]
            self.unregister_group_resource(spec["group"], spec["names"]["plural"])
            self._objects.pop((spec["group"], spec["names"]["plural"]), None)
        self._emit(res, "DELETED", obj)

    def delete(self, res: Resource, namespace: str, name: str, options: Mapping[str, Any]) -> tuple[Obj, bool]:
        """Delete as the generic registry does; returns (object, removed now)."""
        key = (namespace if res.namespaced else "", name)
        obj = self._bucket(res).get(key)
        if obj is None:
            raise status.not_found(res, name)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
            raise status.conflict(
                res,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {obj['metadata']['uid']}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise status.conflict(
                res,
                name,
                f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                f"ResourceVersion in object meta: {obj['metadata']['resourceVersion']}",
            )
        grace = self._grace(res, obj, options)
        policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        new = clone(obj)
        meta = new["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if policy == "Orphan" and "orphan" not in finalizers:
            finalizers.append("orphan")
        if meta.get("deletionTimestamp"):
            current = int(meta.get("deletionGracePeriodSeconds") or 0)
            if grace >= current and finalizers == list(meta.get("finalizers") or []):
                return self._present(res, obj), False
        if not finalizers and grace == 0 and res is not resources.NAMESPACES:
            self._remove(res, key, new)
            return self._present(res, new), True
        meta["finalizers"] = finalizers
        meta["deletionTimestamp"] = _in(grace)
        meta["deletionGracePeriodSeconds"] = grace
        if res is resources.NAMESPACES:
            new["status"]["phase"] = "Terminating"
        meta["resourceVersion"] = self._next_rv()
        self._index(res, obj, add=False)
        self._bucket(res)[key] = new
        self._index(res, new, add=True)
        self._emit(res, "MODIFIED", new, self._present(res, obj))
        return self._present(res, new), False

    @staticmethod
    def _grace(res: Resource, obj: Obj, options: Mapping[str, Any]) -> int:
        """pkg/registry/core/pod/strategy.go CheckGracefulDelete: unscheduled or finished Pods go at once."""
        if res is not resources.PODS:
            return 0
        requested = options.get("gracePeriodSeconds")
        grace = int(requested) if requested is not None else int(obj["spec"].get("terminationGracePeriodSeconds", 30))
        if not obj["spec"].get("nodeName") or obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return 0
        return max(grace, 0)

    def bind(self, namespace: str, name: str, node: str, condition: Obj) -> Obj:
        """The pods/binding subresource: set spec.nodeName once, with the PodScheduled condition."""
        key = (namespace, name)
        old = self._bucket(resources.PODS).get(key)
        if old is None:
            raise status.not_found(resources.PODS, name)
        if old["spec"].get("nodeName"):
            raise status.conflict(
                resources.PODS, name, f"pod {name} is already assigned to node {old['spec']['nodeName']!r}"
            )
        new = clone(old)
        new["spec"]["nodeName"] = node
        conditions = [c for c in new["status"].get("conditions") or [] if c.get("type") != "PodScheduled"]
        new["status"]["conditions"] = [condition, *conditions]
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._bucket(resources.PODS)[key] = new
        self._emit(resources.PODS, "MODIFIED", new, self._present(resources.PODS, old))
        return self._present(resources.PODS, new)

    # --- watch ----------------------------------------------------------------------
    def watch(self, res: Resource, namespace: str | None, match: Match, resource_version: str | None) -> Watcher:
        """Open a watcher: no (or "0") resourceVersion replays the current state as ADDED;
        a number replays the log after it, or ends with 410 Expired when compacted."""
        watcher = Watcher(res, namespace, match)
        if not resource_version or resource_version == "0":
            for obj in self._bucket(res).values():
                watcher.offer(Event(int(obj["metadata"]["resourceVersion"]), "ADDED", self._present(res, obj)))
        else:
            try:
                since = int(resource_version)
            except ValueError as exc:
                raise status.bad_request(
                    f'resourceVersion: Invalid value: "{resource_version}": must be a number'
                ) from exc
            oldest = self._compacted[res.key()]
            if since < oldest:
                watcher.close(status.too_old(since, oldest))
                return watcher
            for event in self._logs[res.key()]:
                if event.rv > since:
                    watcher.offer(event)
        self._watchers[res.key()].append(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        with_res = self._watchers[watcher.resource.key()]
        if watcher in with_res:
            with_res.remove(watcher)

    def watchers(self) -> list[Watcher]:
        return [w for ws in self._watchers.values() for w in ws]

    def namespaced_left(self, namespace: str) -> list[tuple[Resource, Obj]]:
        """Every object still in `namespace` (what the namespace controller waits for)."""
        out = []
        for res in self.served():
            if res.namespaced:
                out += [(res, obj) for (ns, _), obj in self._bucket(res).items() if ns == namespace]
        return out

    def finalize_namespace(self, name: str) -> None:
        """The namespace controller's last step: the `kubernetes` finalizer goes, and so does the namespace."""
        obj = self._bucket(resources.NAMESPACES).get(("", name))
        if obj is not None and not obj["metadata"].get("finalizers"):
            self._remove(resources.NAMESPACES, ("", name), clone(obj))

    def compact(self) -> None:
        """Forget every logged event, as an etcd compaction does: older resourceVersions get 410."""
        for key, log in self._logs.items():
            log.clear()
            self._compacted[key] = self.revision


def _spec_of(obj: Obj) -> Any:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _same(old: Obj, new: Obj) -> bool:
    return same_except_resource_version(old, new)
