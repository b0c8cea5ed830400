"""The default scheduler's filters for the Pods this double runs (pkg/scheduler/framework/
plugins: NodeUnschedulable, NodeAffinity's nodeSelector, TaintToleration, NodeResourcesFit)
and its FitError message: `0/N nodes are available: <sorted "count reason" list>.
preemption: 0/N nodes are available: ...`, on a `PodScheduled=False` condition with reason
`Unschedulable` and a `FailedScheduling` event. A Pod that fits is bound (pods/binding) with
a `Scheduled` event. Unschedulable Pods are retried whenever a Node or Pod changes."""

from __future__ import annotations

import asyncio
from collections import Counter
from decimal import Decimal
from typing import Any

from dynrunner.doubles.kubernetes import resources, status
from dynrunner.doubles.kubernetes.events import Recorder
from dynrunner.doubles.kubernetes.objects import clone
from dynrunner.doubles.kubernetes.quantity import parse
from dynrunner.doubles.kubernetes.resources import Resource
from dynrunner.doubles.kubernetes.store import Event, Obj, Store, now

_NOT_HELPFUL = "Preemption is not helpful for scheduling"
_DONE = ("Succeeded", "Failed")


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol["key"] == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def requests_of(pod: Obj) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for container in pod["spec"].get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, Decimal(0)) + parse(value)
    return total


class Scheduler:
    """Pods that fit nowhere wait in an unschedulable set and are tried again when the cluster
    changes in a way that could make room (a Node added or changed, a Pod gone or finished),
    as the scheduling queue's cluster events do; new Pods are tried at once."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._recorder = Recorder(store, "default-scheduler")
        self._wake = asyncio.Event()
        self._reported: dict[str, str] = {}
        self._pending: set[tuple[str, str]] = set()
        self._retry_unschedulable = False
        store.listeners.append(self._on_event)

    def _on_event(self, res: Resource, event: Event) -> None:
        if res is resources.NODES:
            self._retry_unschedulable = True
        elif res is resources.PODS:
            obj, meta = event.obj, event.obj["metadata"]
            if event.type == "DELETED" or (
                obj["status"].get("phase") in _DONE and (event.old or {}).get("status", {}).get("phase") not in _DONE
            ):
                self._retry_unschedulable = True
            elif not obj["spec"].get("nodeName") and meta["uid"] not in self._reported:
                self._pending.add((meta["namespace"], meta["name"]))
        else:
            return
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._retry_unschedulable:
                self._retry_unschedulable = False
                self._pending |= {
                    (p["metadata"]["namespace"], p["metadata"]["name"])
                    for p in self._store.objects(resources.PODS)
                    if not p["spec"].get("nodeName")
                }
            pending, self._pending = self._pending, set()
            usage = self._usage()
            for namespace, name in sorted(pending):
                pod = self._store.peek(resources.PODS, namespace, name)
                if pod is None:
                    continue
                spec, meta = pod["spec"], pod["metadata"]
                if (
                    spec.get("nodeName")
                    or meta.get("deletionTimestamp")
                    or spec.get("schedulerName") != "default-scheduler"
                ):
                    continue
                try:
                    self._schedule(pod, usage)
                except status.ApiError:
                    continue
            await asyncio.sleep(0)

    def _usage(self) -> dict[str, tuple[int, dict[str, Decimal]]]:
        """Per node: Pods that still hold resources, and the sum of their requests."""
        usage: dict[str, tuple[int, dict[str, Decimal]]] = {}
        for pod in self._store.objects(resources.PODS):
            node = pod["spec"].get("nodeName")
            if not node or pod["status"].get("phase") in _DONE:
                continue
            count, used = usage.get(node, (0, {}))
            for name, value in requests_of(pod).items():
                used[name] = used.get(name, Decimal(0)) + value
            usage[node] = (count + 1, used)
        return usage

    def _schedule(self, pod: Obj, usage: dict[str, tuple[int, dict[str, Decimal]]]) -> None:
        nodes = list(self._store.objects(resources.NODES))
        reasons: Counter[str] = Counter()
        preemption: Counter[str] = Counter()
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            name = node["metadata"]["name"]
            why = self._unfit(pod, node, usage.get(name, (0, {})))
            if why is None:
                self._bind(pod, name)
                count, used = usage.get(name, (0, {}))
                for key, value in requests_of(pod).items():
                    used[key] = used.get(key, Decimal(0)) + value
                usage[name] = (count + 1, used)
                return
            for reason in why:
                reasons[reason] += 1
            preemption[
                "No preemption victims found for incoming pod"
                if why[0].startswith(("Insufficient", "Too many"))
                else _NOT_HELPFUL
            ] += 1
        total = len(nodes)
        message = f"0/{total} nodes are available"
        if reasons:
            message += ": " + ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items())) + "."
            message += (
                f" preemption: 0/{total} nodes are available: "
                + ", ".join(sorted(f"{c} {r}" for r, c in preemption.items()))
                + "."
            )
        else:
            message += "."
        self._unschedulable(pod, message)

    def _unfit(self, pod: Obj, node: Obj, usage: tuple[int, dict[str, Decimal]]) -> list[str] | None:
        spec = pod["spec"]
        if node["spec"].get("unschedulable") and not tolerates(
            spec.get("tolerations") or [], {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        ):
            return ["node(s) were unschedulable"]
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return ["node(s) didn't match Pod's node affinity/selector"]
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
                spec.get("tolerations") or [], taint
            ):
                return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
        allocatable = {k: parse(v) for k, v in (node["status"].get("allocatable") or {}).items()}
        count, used = usage
        out = []
        if "pods" in allocatable and count + 1 > allocatable["pods"]:
            out.append("Too many pods")
        for name, value in sorted(requests_of(pod).items()):
            if value > allocatable.get(name, Decimal(0)) - used.get(name, Decimal(0)):
                out.append(f"Insufficient {name}")
        return out or None

    def _bind(self, pod: Obj, node: str) -> None:
        meta = pod["metadata"]
        condition = {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now()}
        bound = self._store.bind(meta["namespace"], meta["name"], node, condition)
        self._reported.pop(meta["uid"], None)
        self._recorder.event(
            bound, "Normal", "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}"
        )

    def _unschedulable(self, pod: Obj, message: str) -> None:
        meta = pod["metadata"]
        if self._reported.get(meta["uid"]) == message:
            return
        self._reported[meta["uid"]] = message
        new = clone(pod)
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": now(),
        }
        new["status"]["conditions"] = [
            condition,
            *[c for c in new["status"].get("conditions") or [] if c["type"] != "PodScheduled"],
        ]
        updated = self._store.update(resources.PODS, meta["namespace"], meta["name"], new, "status")
        self._recorder.event(updated, "Warning", "FailedScheduling", message)
