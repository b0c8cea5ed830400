"""A job's `container:` as the `job` container of its Pod (docs/kubernetes.md, "Job containers").

The job's steps run in the job image while the executor keeps reporting, masking and the
task's credential: the `job` container's command is the agent (`dynrunner-agent`, static Go,
docs/containers.md), which runs each step process on the executor's request over a unix
socket in an `emptyDir` both containers mount at `/__dynrunner`. A first init container
(`dynrunner-agent-install`, from the executor image) copies the agent and the executor's Node
there, so the job image needs neither. The workspace is mounted at the executor's path, so
every path the executor computes is valid in the job container; the Pod's one network makes
services and the executor's loopback endpoints reachable from steps.

Pure functions of the job's `ContainerSpec` (read with the services, `services.job_containers`)
and the executor container as built; what cannot run raises `JobContainerError` naming the
key or option, before any object exists.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from dynrunner.controller.backends.kubernetes import pod_values
from dynrunner.controller.backends.kubernetes.diagnosis import AGENT_INSTALL_CONTAINER, JOB_CONTAINER
from dynrunner.controller.backends.kubernetes.services import (
    VOLUME_PREFIX,
    JobContainerError,
    limits,
    port,
    security_context,
    volume_mounts,
)
from dynrunner.proto.containers import JOB_CONTAINER_NODE_ENV, JOB_CONTAINER_SOCKET_ENV, ContainerSpec

AGENT_VOLUME = "dynrunner-agent"
AGENT_DIR = "/__dynrunner"
AGENT = f"{AGENT_DIR}/dynrunner-agent"
AGENT_SOCKET = f"{AGENT_DIR}/agent.sock"
AGENT_NODE = f"{AGENT_DIR}/node/bin/node"
SOCKET_ENV = JOB_CONTAINER_SOCKET_ENV
NODE_ENV = JOB_CONTAINER_NODE_ENV
STAGE_AGENT = "stage-agent"
"""The executor's subcommand that copies the agent and Node into a directory."""


def agent_volume() -> dict[str, Any]:
    return {"name": AGENT_VOLUME, "emptyDir": {}}


def agent_mount() -> dict[str, Any]:
    return {"name": AGENT_VOLUME, "mountPath": AGENT_DIR}


def executor_env() -> list[dict[str, str]]:
    return [{"name": SOCKET_ENV, "value": AGENT_SOCKET}, {"name": NODE_ENV, "value": AGENT_NODE}]


def agent_install(executor: Mapping[str, Any], command: Sequence[str]) -> dict[str, Any]:
    """The init container that stages the agent: the executor's image, pull policy, security
    context and resources (it adds nothing to what the Pod is scheduled for: an init
    container's requests count only against the containers' sum), `command` the executor's."""
    container: dict[str, Any] = {
        "name": AGENT_INSTALL_CONTAINER,
        "image": executor["image"],
        "command": [*command, STAGE_AGENT, AGENT_DIR],
        "volumeMounts": [agent_mount()],
        "securityContext": copy.deepcopy(executor["securityContext"]),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    for key in ("imagePullPolicy", "resources"):
        if key in executor:
            container[key] = copy.deepcopy(executor[key])
    return container


def job_container(
    spec: ContainerSpec,
    *,
    pod_security: Literal["restricted", "baseline"],
    shared_mounts: Sequence[Mapping[str, Any]],
    secret_name: str,
) -> dict[str, Any]:
    """The `job` container: the job image running the agent, with the agent's directory, the
    executor's `shared_mounts` (the workspace, the Workload API) at the same paths, and the
    job's named volumes. Its security follows the pool's `servicePodSecurity`, as services'
    does: `restricted` runs no root and drops every capability; `baseline` lets the image's
    root keep the runtime's default capabilities (a root without them could not read the
    executor's runtime files); never privilege or escalation. `env:` values made from secrets
    are read from the job's Secret (`secret_name`), never written in the spec."""
    refused = [
        f"`{option}` is not supported for the job container in Pod pools: {why}"
        for option, given, why in (
            ("--entrypoint", spec.entrypoint, "its command is the runner's agent, which runs the steps"),
            ("--workdir", spec.workdir, "steps run in the workspace, or in their `working-directory`"),
            ("--health-cmd", spec.health, "steps start once the container runs; health options are for services"),
        )
        if given
    ]
    if refused:
        raise JobContainerError("`container`: " + "; ".join(refused))
    security = security_context(spec, pod_security)
    mounts = [agent_mount(), *(dict(m) for m in shared_mounts), *volume_mounts(spec)]
    _check_paths(mounts)
    container: dict[str, Any] = {
        "name": JOB_CONTAINER,
        "image": spec.image,
        "command": [AGENT, AGENT_SOCKET],
        "env": pod_values.env_entries(JOB_CONTAINER, spec.env, secret_name=secret_name),
        "volumeMounts": mounts,
        "securityContext": security,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    ports = [port(spec, p) for p in spec.ports]
    if ports:
        container["ports"] = ports
    resources = limits(spec)
    if resources:
        container["resources"] = {"limits": resources, "requests": dict(resources)}
    return container


def _check_paths(mounts: Sequence[Mapping[str, Any]]) -> None:
    """A named volume may not overlap what the runner mounts (the agent's directory, the
    workspace, the Workload API): the job would lose its agent, or its steps' files would not
    be the executor's."""
    runner = [m for m in mounts if not str(m["name"]).startswith(VOLUME_PREFIX)]
    for mount in mounts:
        if mount in runner:
            continue
        path = str(mount["mountPath"])
        for ours in runner:
            theirs = str(ours["mountPath"])
            if path == theirs or _under(path, theirs) or _under(theirs, path):
                raise JobContainerError(
                    f"`container`: the volume at {path} would overlap {theirs}, which the runner mounts in the "
                    "job container (the agent's directory, the workspace, the Workload API): mount it elsewhere"
                )


def _under(path: str, parent: str) -> bool:
    return path != parent and posixpath.commonpath([path, parent]) == parent
