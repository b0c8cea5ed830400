"""Pod status as the kubelet writes it (pkg/kubelet/kubelet_pods.go generateAPIPodStatus,
status/generate.go): container states, the Pod conditions and phase."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dynrunner.doubles.kubernetes.store import now


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    state: dict[str, Any] = {"reason": reason}
    if message:
        state["message"] = message
    return {"waiting": state}


def container_status(
    name: str, image: str, state: dict[str, Any], *, image_id: str = "", container_id: str = ""
) -> dict[str, Any]:
    running = "running" in state
    out: dict[str, Any] = {
        "name": name,
        "state": state,
        "lastState": {},
        "ready": running,
        "restartCount": 0,
        "image": image,
        "imageID": image_id,
        "started": running,
    }
    if container_id:
        out["containerID"] = container_id
    return out


def terminated(exit_code: int, reason: str, started_at: str, container_id: str, message: str = "") -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": started_at,
        "finishedAt": now(),
        "containerID": container_id,
    }
    if message:
        state["message"] = message
    return {"terminated": state}


def exit_reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"


def condition(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": now()}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def set_condition(status: dict[str, Any], new: dict[str, Any]) -> None:
    conditions = status.setdefault("conditions", [])
    for i, old in enumerate(conditions):
        if old["type"] == new["type"]:
            if (old["status"], old.get("reason"), old.get("message")) == (
                new["status"],
                new.get("reason"),
                new.get("message"),
            ):
                return
            conditions[i] = new
            return
    conditions.append(new)


def pending_conditions(status: dict[str, Any], names: list[str], init_names: Sequence[str] = ()) -> None:
    unready = f"containers with unready status: [{' '.join(names)}]"
    set_condition(status, condition("PodReadyToStartContainers", "True"))
    if init_names:
        incomplete = f"containers with incomplete status: [{' '.join(init_names)}]"
        set_condition(status, condition("Initialized", "False", "ContainersNotInitialized", incomplete))
    else:
        set_condition(status, condition("Initialized", "True"))
    set_condition(status, condition("Ready", "False", "ContainersNotReady", unready))
    set_condition(status, condition("ContainersReady", "False", "ContainersNotReady", unready))


def running_conditions(status: dict[str, Any]) -> None:
    set_condition(status, condition("Ready", "True"))
    set_condition(status, condition("ContainersReady", "True"))


def finished_conditions(status: dict[str, Any], phase: str) -> None:
    reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
    set_condition(status, condition("PodReadyToStartContainers", "False"))
    set_condition(status, condition("Ready", "False", reason))
    set_condition(status, condition("ContainersReady", "False", reason))


def phase_after(statuses: list[dict[str, Any]]) -> str:
    """restartPolicy Never: Succeeded when every container exited 0, else Failed."""
    codes = [s["state"].get("terminated", {}).get("exitCode", 1) for s in statuses]
    return "Succeeded" if all(code == 0 for code in codes) else "Failed"


def initialized(status: dict[str, Any]) -> None:
    """Every init container completed (a sidecar: started): GeneratePodInitializedCondition."""
    set_condition(status, condition("Initialized", "True"))


def init_failed(status: dict[str, Any], inits: list[dict[str, Any]]) -> None:
    """A regular init container failed under restartPolicy Never: the Pod is Failed (getPhase),
    Initialized names every init container not complete (a regular one not ready, a sidecar not
    started); the main containers stay waiting PodInitializing."""
    statuses = {s["name"]: s for s in status.get("initContainerStatuses") or []}
    incomplete = [
        c["name"]
        for c in inits
        if not statuses.get(c["name"], {}).get("started" if c.get("restartPolicy") == "Always" else "ready")
    ]
    status["phase"] = "Failed"
    message = f"containers with incomplete status: [{' '.join(incomplete)}]"
    set_condition(status, condition("Initialized", "False", "ContainersNotInitialized", message))
    finished_conditions(status, "Failed")
