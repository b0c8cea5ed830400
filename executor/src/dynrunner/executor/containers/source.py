"""Where a job's containers come from: podman (`podman.JobContainers`, local and VM pools) or
the job's Pod (`pod.PodJobContainer`, Kubernetes pools). The job loop sees only this seam;
the steps run through the source's agent (`processes`) either way."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dynrunner.executor.containers.agent import AgentProcesses
from dynrunner.executor.containers.podman import ContainerError
from dynrunner.executor.containers.spec import ContainerSpec
from dynrunner.proto.gitea import Result


class JobContainerSource(Protocol):
    processes: AgentProcesses | None
    """The job container's agent once started (None: no job container, services only)."""
    image_env: dict[str, str]
    """The job container's environment: the steps' base environment."""
    node_mount: str
    """Where the job container sees the executor's Node."""
    identity_reachable: bool
    """Whether steps in the job container reach the ID-token endpoint on the executor's loopback."""
    workload_api_reachable: bool
    """Whether the Workload API issues the job's SVID to a process in the job container."""

    async def start(self, job: ContainerSpec | None, services: Sequence[ContainerSpec]) -> None:
        """Until the job container (and services) run; ContainerError saying why not."""
        ...

    def job_context(self) -> dict[str, Any] | None: ...

    def services_context(self) -> dict[str, Any]: ...

    async def close(self) -> None:
        """End the job's containers, whatever happened; never raises."""
        ...


@dataclass(frozen=True, slots=True)
class NotStarted:
    result: Result
    message: str
    error: bool = True


async def start_within(
    source: JobContainerSource,
    job: ContainerSpec | None,
    services: Sequence[ContainerSpec],
    *,
    limit_s: float,
    cancelled: asyncio.Event,
    shutdown: asyncio.Event,
) -> NotStarted | None:
    """Start the job's containers; None once they run, else why not. A cancel, the runner
    shutting down or the job's time (`limit_s`) running out stop a slow start (a long pull, a
    service that takes its time to become healthy)."""
    start = asyncio.create_task(source.start(job, services), name="job-containers-start")
    cancel_watch = asyncio.create_task(cancelled.wait(), name="job-containers-cancel-watch")
    shutdown_watch = asyncio.create_task(shutdown.wait(), name="job-containers-shutdown-watch")
    tasks = (start, cancel_watch, shutdown_watch)
    try:
        await asyncio.wait(tasks, timeout=max(limit_s, 0), return_when="FIRST_COMPLETED")
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    if start.done() and not start.cancelled() and results[0] is None:
        return None
    error = results[0]
    if isinstance(error, (ContainerError, OSError)):
        return NotStarted(Result.FAILURE, str(error))
    if isinstance(error, BaseException) and not isinstance(error, asyncio.CancelledError):
        raise error
    if cancelled.is_set():
        return NotStarted(Result.CANCELLED, "The job was cancelled while its containers started.", error=False)
    if shutdown.is_set():
        return NotStarted(Result.FAILURE, "The runner is shutting down: the job's containers were not started.")
    return NotStarted(
        Result.FAILURE, f"The job's containers did not start within the job's time ({limit_s / 60:.0f} minutes)."
    )
