"""The kubelet double against a real kube-apiserver (docs/real-peers.md, issue 21): the
same `Kubelet` that runs each Pod's containers as local processes, reading and writing
through the API server's REST interface instead of the API double's in-process store.

    with RemoteNode.running(url, ca_file, token, root, images={IMAGE: Image(...)}) as node:
        node.node_uid                        # the Node object it registered

It registers its Node, binds every unscheduled Pod to it (there is no kube-scheduler here:
a `pods/binding` POST, as the scheduler's bind step does), watches the Pods bound to it
(`fieldSelector=spec.nodeName=<node>`, list then watch, a new list after 410 Gone), and
writes container statuses through `pods/{name}/status`, events through `events`, and the
final grace-0 delete as the kubelet does. Secrets are read when a volume is mounted.

`RemoteStore` is the part of the API double's `Store` interface the kubelet and its event
recorder use (`peek`, `update`, `create`, `delete`, `watch`, `unwatch`). Writes are
synchronous HTTP calls from the node's own event loop thread (milliseconds on loopback), so
a status is written in the order the kubelet wrote it; the Pods' cache keeps the newest
resource version it saw, from either a write's answer or the watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dynrunner.doubles.kubernetes import resources, status
from dynrunner.doubles.kubernetes.cluster import NodeSpec, node_object
from dynrunner.doubles.kubernetes.images import Image
from dynrunner.doubles.kubernetes.kubelet import Kubelet, KubeletOptions
from dynrunner.doubles.kubernetes.store import Event, Match, Obj, Watcher


class RemoteError(Exception):
    def __init__(self, code: int, body: str) -> None:
        super().__init__(f"{code}: {body[:300]}")
        self.code = code


class Rest:
    """Bearer-token JSON calls to one API server (the standard library: no client here)."""

    def __init__(self, url: str, ca_file: Path, token: str) -> None:
        self.url = url.rstrip("/")
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.token = token

    def open(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", timeout: float = 30
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            return urllib.request.urlopen(request, context=self.context, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise RemoteError(err.code, err.read().decode(errors="replace")) from None

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        with self.open(method, path, body, content_type) as answer:
            return json.loads(answer.read() or b"null")


def _path(res: resources.Resource, namespace: str, name: str = "", sub: str = "") -> str:
    base = f"/api/{res.version}" if not res.group else f"/apis/{res.group}/{res.version}"
    if res.namespaced and namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{res.plural}"
    if name:
        base += f"/{name}"
    if sub:
        base += f"/{sub}"
    return base


def _rv(obj: Obj) -> int:
    return int(obj["metadata"].get("resourceVersion") or 0)


class RemoteStore:
    """What the kubelet double reads and writes, on a real API server."""

    def __init__(self, rest: Rest, node: str) -> None:
        self.rest = rest
        self.node = node
        self.pods: dict[tuple[str, str], Obj] = {}
        self.watchers: list[Watcher] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()

    def peek(self, res: resources.Resource, namespace: str, name: str) -> Obj | None:
        if res == resources.PODS:
            with self.lock:
                return self.pods.get((namespace, name))
        if res == resources.EVENTS:
            return None  # every event is recorded anew (no count bumps)
        try:
            return dict(self.rest.call("GET", _path(res, namespace, name)))
        except RemoteError as err:
            if err.code == 404:
                return None
            raise

    def update(self, res: resources.Resource, namespace: str, name: str, body: Obj, subresource: str = "") -> Obj:
        if res == resources.PODS and subresource == "status":
            # A merge patch of the whole status: lists (conditions, containerStatuses) are
            # replaced as the kubelet's own status manager replaces them.
            try:
                answer = self.rest.call(
                    "PATCH",
                    _path(res, namespace, name, "status"),
                    {"status": body["status"]},
                    "application/merge-patch+json",
                )
            except RemoteError as err:
                raise status.ApiError(err.code, "Failure", str(err)) from None
            self._cache(answer)
            return dict(answer)
        with contextlib.suppress(RemoteError):
            return dict(self.rest.call("PUT", _path(res, namespace, name, subresource), body))
        return body

    def create(self, res: resources.Resource, namespace: str, body: Obj) -> Obj:
        body = {"apiVersion": res.api_version, "kind": res.kind, **body}
        try:
            return dict(self.rest.call("POST", _path(res, namespace), body))
        except RemoteError:
            return body  # an event refused (its namespace is going away): as a kubelet, go on

    def delete(
        self, res: resources.Resource, namespace: str, name: str, options: Mapping[str, Any]
    ) -> tuple[Obj, bool]:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", **options}
        try:
            answer = self.rest.call("DELETE", _path(res, namespace, name), body)
        except RemoteError as err:
            if err.code in (404, 409):
                return {}, False
            raise
        return dict(answer or {}), True

    def watch(self, res: resources.Resource, namespace: str | None, match: Match, rv: str | None) -> Watcher:
        watcher = Watcher(res, namespace, match)
        with self.lock:
            for pod in self.pods.values():
                watcher.offer(Event(_rv(pod), "ADDED", pod))
        self.watchers.append(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)

    # --- the Pods bound to this node ----------------------------------------------------
    def _cache(self, pod: Obj) -> bool:
        """Keep the newest version; False when `pod` is older than the one cached."""
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        with self.lock:
            cached = self.pods.get(key)
            if cached is not None and cached["metadata"]["uid"] == pod["metadata"]["uid"] and _rv(cached) > _rv(pod):
                return False
            self.pods[key] = pod
        return True

    def _deliver(self, type_: str, pod: Obj) -> None:
        if type_ == "DELETED":
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            with self.lock:
                if self.pods.get(key, {}).get("metadata", {}).get("uid") == pod["metadata"]["uid"]:
                    del self.pods[key]
        elif not self._cache(pod):
            return
        event = Event(_rv(pod), type_, pod)
        for watcher in list(self.watchers):
            assert self.loop is not None
            self.loop.call_soon_threadsafe(watcher.offer, event)

    def follow(self, stop: threading.Event, selector: str, on_event: Callable[[str, Obj], None]) -> None:
        """List then watch the Pods matching the field `selector` until `stop`; after a cut
        connection or 410 Gone, list again (the objects listed come as ADDED, the ones gone
        since as DELETED)."""
        known: dict[str, Obj] = {}
        query = urllib.parse.urlencode({"fieldSelector": selector})
        while not stop.is_set():
            try:
                listed = self.rest.call("GET", f"/api/v1/pods?{query}")
                now = {p["metadata"]["uid"]: p for p in listed["items"]}
                for uid, pod in known.items():
                    if uid not in now:
                        on_event("DELETED", pod)
                for pod in now.values():
                    on_event("ADDED", pod)
                known = now
                rv = listed["metadata"]["resourceVersion"]
                watch = urllib.parse.urlencode(
                    {"fieldSelector": selector, "watch": "1", "resourceVersion": rv, "timeoutSeconds": "30"}
                )
                with self.rest.open("GET", f"/api/v1/pods?{watch}", timeout=60) as stream:
                    for line in stream:
                        if stop.is_set():
                            return
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            break  # 410 Gone (or another error): list again
                        if event["type"] == "BOOKMARK":
                            continue
                        obj = event["object"]
                        if event["type"] == "DELETED":
                            known.pop(obj["metadata"]["uid"], None)
                        else:
                            known[obj["metadata"]["uid"]] = obj
                        on_event(event["type"], obj)
            except (OSError, RemoteError, ValueError, KeyError):
                if not stop.is_set():
                    time.sleep(0.5)


class RemoteNode:
    """One kubelet double (and the binder that schedules every Pod onto it) in a thread of its
    own, against a real API server."""

    def __init__(
        self,
        url: str,
        ca_file: Path,
        token: str,
        root: Path,
        *,
        node: NodeSpec | None = None,
        images: dict[str, Image] | None = None,
        csi: dict[str, Path] | None = None,
    ) -> None:
        self.spec = node or NodeSpec("node-a")
        self.rest = Rest(url, ca_file, token)
        self.store = RemoteStore(self.rest, self.spec.name)
        self.root = root
        self.images = dict(images or {})
        self.csi = dict(csi or {})
        self.stopping = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.threads: list[threading.Thread] = []
        self.kubelet: Kubelet | None = None
        self.node_uid = ""
        self.bound: list[str] = []

    def _register(self) -> Obj:
        body = {"apiVersion": "v1", "kind": "Node", **node_object(self.spec)}
        wanted_status = body.pop("status")
        with contextlib.suppress(RemoteError):
            self.rest.call("DELETE", f"/api/v1/nodes/{self.spec.name}")
        created = self.rest.call("POST", "/api/v1/nodes", body)
        return dict(
            self.rest.call(
                "PATCH",
                f"/api/v1/nodes/{self.spec.name}/status",
                {"status": wanted_status},
                "application/merge-patch+json",
            )
            or created
        )

    def _bind(self, type_: str, pod: Obj) -> None:
        if type_ == "DELETED" or pod["metadata"].get("deletionTimestamp") or pod["spec"].get("nodeName"):
            return
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.spec.name},
        }
        with contextlib.suppress(RemoteError):
            self.rest.call("POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", binding)
            self.bound.append(f"{meta['namespace']}/{meta['name']}")

    def start(self) -> RemoteNode:
        node = self._register()
        self.node_uid = node["metadata"]["uid"]
        self.store.loop = self.loop
        options = KubeletOptions(self.root / self.spec.name, self.images, 10.0, 1.0, self.csi)
        self.kubelet = Kubelet(self.store, self.spec.name, options, {}, node)  # type: ignore[arg-type]
        ready = threading.Event()

        def run_loop() -> None:
            asyncio.set_event_loop(self.loop)
            assert self.kubelet is not None
            task = self.loop.create_task(self.kubelet.run())
            self.loop.call_soon(ready.set)
            with contextlib.suppress(asyncio.CancelledError):
                self.loop.run_until_complete(task)

        self.threads.append(threading.Thread(target=run_loop, name=f"kubelet-{self.spec.name}", daemon=True))
        self.threads.append(
            threading.Thread(
                target=self.store.follow,
                args=(self.stopping, f"spec.nodeName={self.spec.name}", self.store._deliver),
                name=f"pods-{self.spec.name}",
                daemon=True,
            )
        )
        self.threads.append(
            threading.Thread(
                target=self.store.follow,
                args=(self.stopping, "spec.nodeName=", self._bind),
                name=f"binder-{self.spec.name}",
                daemon=True,
            )
        )
        for thread in self.threads:
            thread.start()
        ready.wait(10)
        return self

    def oom_kill(self, namespace: str, name: str) -> None:
        """The kernel's OOM killer takes the Pod's container: exit 137, reason OOMKilled (the
        kubelet double's scripted failure, as `Cluster.oom_kill`)."""
        assert self.kubelet is not None
        kubelet = self.kubelet
        done = threading.Event()
        failure: list[BaseException] = []

        def kill() -> None:
            try:
                kubelet.worker(namespace, name).terminate("", "", 0, "OOMKilled")
            except BaseException as err:
                failure.append(err)
            done.set()

        self.loop.call_soon_threadsafe(kill)
        done.wait(10)
        if failure:
            raise failure[0]

    def stop(self) -> None:
        self.stopping.set()
        if self.kubelet is not None:
            kubelet = self.kubelet

            def end() -> None:
                kubelet.lost = True
                for watcher in list(self.store.watchers):
                    watcher.close()

            self.loop.call_soon_threadsafe(end)
        for thread in self.threads[:1]:
            thread.join(15)
        if not self.threads[0].is_alive():
            self.loop.close()
        with contextlib.suppress(RemoteError, OSError):
            self.rest.call("DELETE", f"/api/v1/nodes/{self.spec.name}")

    @classmethod
    @contextmanager
    def running(cls, url: str, ca_file: Path, token: str, root: Path, **options: Any) -> Iterator[RemoteNode]:
        node = cls(url, ca_file, token, root, **options).start()
        try:
            yield node
        finally:
            node.stop()
