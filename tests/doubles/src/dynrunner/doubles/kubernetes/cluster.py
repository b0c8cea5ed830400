"""`Cluster`: the API double with a scheduler, a kubelet per Node, the node lifecycle
controller's reaction to a lost node, and (when asked) the SPIRE doubles.

    with Cluster.running(tmp_path, nodes=[NodeSpec("node-a")], images={"executor:1.0": Image(...)}) as cluster:
        cluster.api.url  ...
        cluster.oom_kill("ci", "job-1")

Node lost (pkg/controller/nodelifecycle): after `node_monitor_grace` the Node's conditions
go Unknown ("Kubelet stopped posting node status."), it gets the `unreachable` NoSchedule
and NoExecute taints, its Pods' Ready condition goes False; after each Pod's toleration of
the NoExecute taint (300 s by default; `eviction_seconds` overrides it for tests) the taint
eviction controller deletes the Pod with a DisruptionTarget condition. With no kubelet to
finish the deletion, the Pod stays terminating, as in a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynrunner.doubles.kubernetes import podstatus, resources, status
from dynrunner.doubles.kubernetes.events import Recorder
from dynrunner.doubles.kubernetes.images import Image
from dynrunner.doubles.kubernetes.kubelet import ContainerRef, Kubelet, KubeletOptions
from dynrunner.doubles.kubernetes.objects import clone
from dynrunner.doubles.kubernetes.scheduler import Scheduler
from dynrunner.doubles.kubernetes.server import ApiServer
from dynrunner.doubles.kubernetes.store import Obj, now


@dataclass(frozen=True)
class NodeSpec:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, Any], ...] = ()
    cpu: str = "4"
    memory: str = "8Gi"
    pods: int = 110


def node_object(spec: NodeSpec) -> Obj:
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods), "ephemeral-storage": "100Gi"}
    conditions = [
        podstatus.condition(
            "MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"
        ),
        podstatus.condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        podstatus.condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        podstatus.condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    for cond in conditions:
        cond.pop("lastProbeTime")
        cond["lastHeartbeatTime"] = now()
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **spec.labels,
    }
    return {
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {"taints": [dict(t) for t in spec.taints]} if spec.taints else {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": spec.name}],
            "nodeInfo": {
                "machineID": uuid.uuid4().hex,
                "systemUUID": str(uuid.uuid4()),
                "bootID": str(uuid.uuid4()),
                "kernelVersion": os.uname().release,
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.32.0",
                "kubeProxyVersion": "v1.32.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


class Cluster:
    def __init__(
        self,
        root: Path,
        *,
        nodes: Sequence[NodeSpec] = (NodeSpec("node-a"),),
        images: dict[str, Image] | None = None,
        pull_backoff: float = 10.0,
        retry: float = 1.0,
        node_monitor_grace: float = 40.0,
        eviction_seconds: float | None = None,
        api: dict[str, Any] | None = None,
        spire: Any = None,
    ) -> None:
        self.root = root
        self.api = ApiServer(**(api or {}))
        self.registry: dict[int, ContainerRef] = {}
        self.kubelets: dict[str, Kubelet] = {}
        self._nodes = list(nodes)
        self._images = dict(images or {})
        self._pull_backoff, self._retry = pull_backoff, retry
        self._grace, self._eviction = node_monitor_grace, eviction_seconds
        self.csi: dict[str, dict[str, Path]] = {spec.name: {} for spec in nodes}
        self._spire_options = spire
        self.spire: Any = None

    def start(self) -> Cluster:
        self.api.pod_logs = lambda node, uid, container: self.root / node / "pods" / uid / "logs" / f"{container}.log"
        self.api.start()
        self.api.spawn(Scheduler(self.api.store).run(), "scheduler")
        for spec in self._nodes:
            self.api.call(self._add_node, spec)
        if self._spire_options is not None:
            self.api.run(self._start_spire())
        return self

    async def _start_spire(self) -> None:
        """A SPIRE agent per node; each node's csi.spiffe.io volumes show its socket directory."""
        from dynrunner.doubles.spire.double import Spire

        self.spire = Spire(self.api.store, self._spire_options, self.registry)
        for name in self.kubelets:
            agent = await self.spire.add_k8s_agent(name, self.node_uid(name))
            self.csi[name]["csi.spiffe.io"] = agent.socket_path.parent
        self.api.spawn(self.spire.controller_manager.run(), "spire-controller-manager")
        self.api.on_stop.append(self.spire.stop)

    def _add_node(self, spec: NodeSpec) -> None:
        node = self.api.store.create(resources.NODES, "", node_object(spec))
        options = KubeletOptions(
            self.root / spec.name, self._images, self._pull_backoff, self._retry, self.csi[spec.name]
        )
        kubelet = Kubelet(self.api.store, spec.name, options, self.registry, node)
        self.kubelets[spec.name] = kubelet
        self.api.spawn(kubelet.run(), f"kubelet-{spec.name}")

    def stop(self) -> None:
        self.api.stop()

    @classmethod
    @contextmanager
    def running(cls, root: Path, **options: Any) -> Iterator[Cluster]:
        cluster = cls(root, **options).start()
        try:
            yield cluster
        finally:
            cluster.stop()

    def node_uid(self, name: str) -> str:
        return str(self.kubelets[name].node_object["metadata"]["uid"])

    # --- scripted failures --------------------------------------------------------------
    def _worker_call(self, namespace: str, name: str, fn: Any) -> None:
        def find() -> None:
            pod = self.api.store.peek(resources.PODS, namespace, name)
            if pod is None or not pod["spec"].get("nodeName"):
                raise KeyError(f"pod {namespace}/{name} is not on a node")
            fn(self.kubelets[pod["spec"]["nodeName"]].worker(namespace, name))

        self.api.call(find)

    def oom_kill(self, namespace: str, name: str, container: str | None = None) -> None:
        """The kernel's OOM killer takes the Pod's containers (or only `container`, whose
        memory limit it reached): exit 137, reason OOMKilled. One container killed leaves the
        others running, and the Pod with them."""
        if container is None:
            self._worker_call(namespace, name, lambda w: w.terminate("", "", 0, "OOMKilled"))
        else:
            self._worker_call(namespace, name, lambda w: w.oom_kill(container))

    def evict(self, namespace: str, name: str, resource: str = "memory") -> None:
        """The kubelet evicts the Pod under node pressure: phase Failed, reason Evicted."""
        message = f"The node was low on resource: {resource}. Threshold quantity: 100Mi, available: 50Mi. "

        def evict(worker: Any) -> None:
            worker.write(
                lambda st: podstatus.set_condition(
                    st, podstatus.condition("DisruptionTarget", "True", "TerminationByKubelet", message)
                )
            )
            worker.terminate("Evicted", message, 0)
            worker.event("Warning", "Evicted", message)

        self._worker_call(namespace, name, evict)

    def lose_node(self, name: str, kill_processes: bool = True) -> None:
        """The node stops answering; the node lifecycle controller reacts as described above."""
        self.api.call(self.kubelets[name].lose, kill_processes)
        self.api.spawn(self._node_lost(name), f"node-lifecycle-{name}")

    async def _node_lost(self, name: str) -> None:
        store = self.api.store
        await asyncio.sleep(self._grace)
        node = clone(store.peek(resources.NODES, "", name))
        if node is None:
            return
        for cond in node["status"]["conditions"]:
            cond.update(
                status="Unknown",
                reason="NodeStatusUnknown",
                message="Kubelet stopped posting node status.",
                lastTransitionTime=now(),
            )
        store.update(resources.NODES, "", name, node, "status")
        node = clone(store.peek(resources.NODES, "", name))
        assert node is not None
        taints = node["spec"].setdefault("taints", [])
        for effect in ("NoSchedule", "NoExecute"):
            taints.append({"key": "node.kubernetes.io/unreachable", "effect": effect, "timeAdded": now()})
        store.update(resources.NODES, "", name, node)
        Recorder(store, "node-controller").event(
            {**node, "apiVersion": "v1", "kind": "Node"},
            "Normal",
            "NodeNotReady",
            f"Node {name} status is now: NodeNotReady",
        )
        on_node = [p for p in store.objects(resources.PODS) if p["spec"].get("nodeName") == name]
        for pod in on_node:
            new = clone(pod)
            for cond in new["status"].get("conditions") or []:
                if cond["type"] == "Ready":
                    cond.update(status="False", lastTransitionTime=now())
            with contextlib.suppress(status.ApiError):
                store.update(resources.PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], new, "status")
        await asyncio.gather(*(self._evict_after_toleration(pod) for pod in on_node))

    async def _evict_after_toleration(self, pod: Obj) -> None:
        seconds: float | None = self._eviction
        if seconds is None:
            tolerations = [
                t
                for t in pod["spec"].get("tolerations") or []
                if t.get("key") in ("node.kubernetes.io/unreachable", None) and t.get("effect") in ("NoExecute", None)
            ]
            if not tolerations:
                seconds = 0
            elif any(t.get("tolerationSeconds") is None for t in tolerations):
                return
            else:
                seconds = min(float(t["tolerationSeconds"]) for t in tolerations)
        await asyncio.sleep(seconds)
        store = self.api.store
        meta = pod["metadata"]
        current = store.peek(resources.PODS, meta["namespace"], meta["name"])
        if current is None or current["metadata"]["uid"] != meta["uid"]:
            return
        new = clone(current)
        podstatus.set_condition(
            new["status"],
            podstatus.condition(
                "DisruptionTarget", "True", "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint"
            ),
        )
        with contextlib.suppress(status.ApiError):
            store.update(resources.PODS, meta["namespace"], meta["name"], new, "status")
            store.delete(resources.PODS, meta["namespace"], meta["name"], {})
