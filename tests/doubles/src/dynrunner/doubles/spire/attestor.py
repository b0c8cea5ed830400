"""Workload attestation: the selectors SPIRE's agent derives for a calling process.

- unix (doc/plugin_agent_workloadattestor_unix.md): `uid`, `gid` (and `user`, `group` when
  the names resolve) from the caller's peer credentials.
- k8s (doc/plugin_agent_workloadattestor_k8s.md): SPIRE reads the caller's cgroups to find
  its container and asks its own node's kubelet for the Pod. The double finds the container
  by walking the caller's process ancestry (/proc/<pid>/stat) up to a container process the
  kubelet double started on this agent's node; a process of another node's Pod gets no k8s
  selectors, as it would from a real agent. Selectors: `ns`, `sa`, `pod-uid`, `pod-name`,
  `container-name`, `node-name`, `pod-label:<k>:<v>`, `container-image`, `pod-image`.
"""

from __future__ import annotations

import grp
import pwd
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dynrunner.doubles.spire.entries import Selector


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int


def unix_selectors(caller: Caller) -> set[Selector]:
    out = {("unix", f"uid:{caller.uid}"), ("unix", f"gid:{caller.gid}")}
    try:
        out.add(("unix", f"user:{pwd.getpwuid(caller.uid).pw_name}"))
    except KeyError:
        pass
    try:
        out.add(("unix", f"group:{grp.getgrgid(caller.gid).gr_name}"))
    except KeyError:
        pass
    return out


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1])


def ancestry(pid: int) -> list[int]:
    chain: list[int] = []
    current: int | None = pid
    while current and current > 1 and len(chain) < 64:
        chain.append(current)
        current = parent_pid(current)
    return chain


# Returns (namespace, pod name, pod uid, container name, node, service account) for a container's pid,
# and the Pod object for labels and images.
ContainerLookup = Callable[[int], tuple[Any, Mapping[str, Any] | None] | None]


def k8s_selectors(caller: Caller, node: str, lookup: ContainerLookup) -> set[Selector]:
    for pid in ancestry(caller.pid):
        found = lookup(pid)
        if found is None:
            continue
        ref, pod = found
        if ref.node != node:
            return set()
        out = {
            ("k8s", f"ns:{ref.namespace}"),
            ("k8s", f"sa:{ref.service_account}"),
            ("k8s", f"pod-uid:{ref.pod_uid}"),
            ("k8s", f"pod-name:{ref.pod_name}"),
            ("k8s", f"container-name:{ref.container}"),
            ("k8s", f"node-name:{ref.node}"),
        }
        if pod is not None:
            for key, value in ((pod.get("metadata") or {}).get("labels") or {}).items():
                out.add(("k8s", f"pod-label:{key}:{value}"))
            for container in pod.get("spec", {}).get("containers") or []:
                out.add(("k8s", f"pod-image:{container['image']}"))
                if container["name"] == ref.container:
                    out.add(("k8s", f"container-image:{container['image']}"))
        return out
    return set()
