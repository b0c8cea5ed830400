"""`GET pods/<name>/log`: kube-apiserver's checks (pkg/registry/core/pod/strategy.go
LogLocation: a host assigned, the container named when there are several, a valid name)
and the kubelet's (validateContainerLogStatus: a waiting container has no log yet), then the
container's output with `tailLines` and `limitBytes`. `follow`, `previous` and `timestamps`
are not modelled (`previous` answers the kubelet's "previous terminated container not found")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dynrunner.doubles.kubernetes.status import bad_request

LogSource = Callable[[str, str, str], Path | None]  # (node, pod uid, container) → log file


def read(pod: Mapping[str, Any], query: Mapping[str, str], source: LogSource | None) -> bytes:
    name = pod["metadata"]["name"]
    names = [c["name"] for c in pod["spec"].get("containers") or []]
    container = query.get("container", "")
    if not container:
        if len(names) != 1:
            raise bad_request(f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]")
        container = names[0]
    if container not in names:
        raise bad_request(f"container {container} is not valid for pod {name}")
    node = pod["spec"].get("nodeName")
    if not node:
        raise bad_request(f"pod {name} does not have a host assigned")
    statuses = {s["name"]: s for s in pod.get("status", {}).get("containerStatuses") or []}
    state = statuses.get(container, {}).get("state", {"waiting": {"reason": "ContainerCreating"}})
    if query.get("previous", "").lower() in ("1", "true"):
        raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
    if "waiting" in state:
        reason = state["waiting"].get("reason", "")
        if reason in ("ErrImagePull", "ImagePullBackOff"):
            reason = "trying and failing to pull image"
        raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: {reason}')
    path = source(node, pod["metadata"]["uid"], container) if source else None
    data = path.read_bytes() if path is not None and path.exists() else b""
    if query.get("tailLines"):
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-int(query["tailLines"]) :]) if int(query["tailLines"]) else b""
    if query.get("limitBytes"):
        data = data[: int(query["limitBytes"])]
    return data
