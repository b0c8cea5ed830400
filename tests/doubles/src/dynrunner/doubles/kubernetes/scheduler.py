"""The default scheduler's filters for the Pods this double runs (pkg/scheduler/framework/
plugins: NodeUnschedulable, NodeAffinity's nodeSelector, TaintToleration, NodeResourcesFit)
and its FitError message: `0/N nodes are available: <sorted "count reason" list>.
preemption: 0/N nodes are available: ...`, on a `PodScheduled=False` condition with reason
`Unschedulable` and a `FailedScheduling` event. A Pod that fits is bound (pods/binding) with
a `Scheduled` event. Unschedulable Pods are retried whenever a Node or Pod changes."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from decimal import Decimal
from typing import Any

from dynrunner.doubles.kubernetes import resources, status
from dynrunner.doubles.kubernetes.events import Recorder
from dynrunner.doubles.kubernetes.quantity import parse
from dynrunner.doubles.kubernetes.store import Obj, Store, now

_NOT_HELPFUL = "Preemption is not helpful for scheduling"


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
    def __init__(self, store: Store) -> None:
        self._store = store
        self._recorder = Recorder(store, "default-scheduler")
        self._wake = asyncio.Event()
        self._reported: dict[str, str] = {}
        store.listeners.append(lambda res, _: self._wake.set() if res in (resources.PODS, resources.NODES) else None)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for pod in list(self._store.objects(resources.PODS)):
                spec, meta = pod["spec"], pod["metadata"]
                if (
                    spec.get("nodeName")
                    or meta.get("deletionTimestamp")
                    or spec.get("schedulerName") != "default-scheduler"
                ):
                    continue
                try:
                    self._schedule(pod)
                except status.ApiError:
                    continue
            await asyncio.sleep(0)

    def _schedule(self, pod: Obj) -> None:
        nodes = list(self._store.objects(resources.NODES))
        reasons: Counter[str] = Counter()
        preemption: Counter[str] = Counter()
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            why = self._unfit(pod, node)
            if why is None:
                self._bind(pod, node["metadata"]["name"])
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

    def _unfit(self, pod: Obj, node: Obj) -> list[str] | None:
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
        used: dict[str, Decimal] = {}
        count = 0
        for other in self._store.objects(resources.PODS):
            if other["spec"].get("nodeName") == node["metadata"]["name"] and other["status"].get("phase") not in (
                "Succeeded",
                "Failed",
            ):
                count += 1
                for name, value in requests_of(other).items():
                    used[name] = used.get(name, Decimal(0)) + value
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
        new = copy.deepcopy(pod)
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
