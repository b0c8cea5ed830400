"""The job container of a Kubernetes pool: the Pod's container `job`, started by the kubelet.

The controller builds it (docs/containers.md, "Pods: job containers"): an init container
stages the agent and the executor's Node in the `emptyDir` at `/__dynrunner`, the `job`
container runs the agent as its command, and the executor is told the agent's socket
(`DYNRUNNER_JOB_CONTAINER_SOCKET`). So no podman here: wait until the socket accepts (the
kubelet may still be pulling the image), take the agent's environment as the steps' base,
run the steps through it, and ask it to shut down when the job ends, so the Pod ends too
(`restartPolicy: Never` keeps a Pod running while any container runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynrunner.executor.containers.agent import AgentError, AgentProcesses
from dynrunner.executor.containers.podman import NODE_MOUNT, ContainerError
from dynrunner.executor.containers.spec import ContainerSpec
from dynrunner.proto.containers import JOB_CONTAINER_NODE_ENV, JOB_CONTAINER_SOCKET_ENV

log = logging.getLogger(__name__)

WAIT_ENV = "DYNRUNNER_JOB_CONTAINER_WAIT_S"
"""Seconds the executor waits for the job container's agent (default 600: an image pull)."""
DEFAULT_WAIT_S = 600.0
SHUTDOWN_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class PodContainerConfig:
    socket: Path
    node: str
    wait_s: float
    pod: str
    """The Pod's name (its hostname), for `job.container.id`."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PodContainerConfig | None:
        """The configuration, or None when this executor's Pod has no job container."""
        path = env.get(JOB_CONTAINER_SOCKET_ENV, "")
        if not path:
            return None
        try:
            wait_s = float(env.get(WAIT_ENV, "") or DEFAULT_WAIT_S)
        except ValueError:
            log.warning("%s=%r is not a number of seconds: waiting %.0f s", WAIT_ENV, env[WAIT_ENV], DEFAULT_WAIT_S)
            wait_s = DEFAULT_WAIT_S
        return cls(
            socket=Path(path),
            node=env.get(JOB_CONTAINER_NODE_ENV, "") or NODE_MOUNT,
            wait_s=wait_s,
            pod=socket.gethostname(),
        )


async def wait_for_agent(path: Path, wait_s: float) -> None:
    """Until the agent at `path` accepts a connection; ContainerError after `wait_s`.
    Polls (0.05 s, doubling to 1 s): a socket file gives nothing to wait on."""
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    every = 0.05
    while True:
        try:
            _, writer = await asyncio.open_unix_connection(str(path))
        except OSError as err:
            if loop.time() + every > end:
                raise ContainerError(
                    f"The job container did not start: its agent did not answer at {path} within {wait_s:.0f} s "
                    f"(last: {err.strerror or err}). The Pod's events say why (an image that cannot be pulled, "
                    "a container that exits at once)."
                ) from err
            await asyncio.sleep(every)
            every = min(every * 2, 1.0)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return


async def shutdown_agent(path: Path) -> bool:
    """Ask the agent at `path` to kill its processes and exit; False when it is not there
    (already shut down, or never started). Bounded; never raises."""
    try:
        killed = await asyncio.wait_for(AgentProcesses(path).shutdown(), SHUTDOWN_WAIT_S)
    except AgentError as err:
        if isinstance(err.__cause__, (FileNotFoundError, ConnectionRefusedError)):
            return False  # its socket is gone: it shut down already, or never started
        log.info("the job container's agent at %s did not take the shutdown: %s", path, err)
        return False
    except (OSError, ValueError, TimeoutError) as err:
        log.info("the job container's agent at %s did not take the shutdown: %s", path, err)
        return False
    log.info("the job container's agent shut down (%d process group(s) killed)", killed)
    return True


def sidecar_context(specs: Sequence[ContainerSpec]) -> dict[str, Any]:
    """`job.services` for a Pod's sidecars: no container id the job could use, the Pod's
    network, and each port as itself (reached on localhost or the service's name)."""
    return {
        spec.name: {"id": "", "network": "", "ports": {p.rsplit(":", 1)[-1]: p.rsplit(":", 1)[-1] for p in spec.ports}}
        for spec in specs
    }


class PodJobContainer:
    """`JobContainerSource` (containers/source.py) for the Pod's `job` container; its services
    are the Pod's sidecars, already healthy when the executor starts."""

    identity_reachable = True
    """The Pod's network namespace is shared: the ID-token endpoint on loopback is reachable."""
    workload_api_reachable = False
    """The job's SPIRE entry names the `executor` container: a process in `job` would be told
    "no identity issued", so steps there get no SPIFFE_ENDPOINT_SOCKET (ID tokens they do get)."""

    def __init__(self, config: PodContainerConfig, *, log: Callable[[str], None]) -> None:
        self.config = config
        self.log = log
        self.node_mount = config.node
        self.processes: AgentProcesses | None = None
        self.image_env: dict[str, str] = {}
        self._services: list[ContainerSpec] = []

    async def start(self, job: ContainerSpec | None, services: Sequence[ContainerSpec]) -> None:
        self._services = list(services)
        if job is not None:
            self.log(f"Waiting for the job container ({job.image}) to start")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await wait_for_agent(self.config.socket, self.config.wait_s)
        agent = AgentProcesses(self.config.socket)
        try:
            self.image_env = await agent.env()
        except AgentError as err:
            raise ContainerError(f"The job container did not start: {err}") from err
        self.processes = agent
        self.log(f"Job container started ({loop.time() - started:.1f} s)")
        if self._services:
            self.log(f"Services: {', '.join(s.name for s in self._services)} (sidecars of the job's Pod, healthy)")

    def job_context(self) -> dict[str, Any] | None:
        return {"id": f"{self.config.pod}/job", "network": ""}

    def services_context(self) -> dict[str, Any]:
        return sidecar_context(self._services)

    async def close(self) -> None:
        """Stop the job container: its agent kills what the steps left and exits."""
        await shutdown_agent(self.config.socket)


def job_container_socket() -> Path | None:
    """The Pod's job container socket, for a last shutdown when the executor ends."""
    path = os.environ.get(JOB_CONTAINER_SOCKET_ENV, "")
    return Path(path) if path else None
