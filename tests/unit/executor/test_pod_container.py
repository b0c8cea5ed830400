"""The Pod job container's settings and contexts, and how a slow container start ends
(containers/pod.py, containers/source.py)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dynrunner.executor.containers.agent import AgentProcesses
from dynrunner.executor.containers.pod import (
    DEFAULT_WAIT_S,
    PodContainerConfig,
    PodJobContainer,
    sidecar_context,
    wait_for_agent,
)
from dynrunner.executor.containers.podman import ContainerError
from dynrunner.executor.containers.source import start_within
from dynrunner.executor.containers.spec import ContainerSpec
from dynrunner.proto.gitea import Result


def test_no_socket_means_no_pod_job_container() -> None:
    assert PodContainerConfig.from_env({"DYNRUNNER_JOB_CONTAINER_NODE": "/x"}) is None


def test_the_settings_come_from_the_pods_environment() -> None:
    config = PodContainerConfig.from_env(
        {
            "DYNRUNNER_JOB_CONTAINER_SOCKET": "/__dynrunner/agent.sock",
            "DYNRUNNER_JOB_CONTAINER_NODE": "/__dynrunner/node/bin/node",
            "DYNRUNNER_JOB_CONTAINER_WAIT_S": "90",
        }
    )
    assert config == PodContainerConfig(
        socket=Path("/__dynrunner/agent.sock"),
        node="/__dynrunner/node/bin/node",
        wait_s=90.0,
        pod=socket.gethostname(),
    )


def test_defaults_wait_ten_minutes_and_use_the_staged_node(caplog: pytest.LogCaptureFixture) -> None:
    config = PodContainerConfig.from_env(
        {"DYNRUNNER_JOB_CONTAINER_SOCKET": "/s/agent.sock", "DYNRUNNER_JOB_CONTAINER_WAIT_S": "ten minutes"}
    )
    assert config is not None
    assert (config.wait_s, config.node) == (DEFAULT_WAIT_S, "/__dynrunner/node/bin/node")
    assert DEFAULT_WAIT_S == 600
    assert "DYNRUNNER_JOB_CONTAINER_WAIT_S='ten minutes' is not a number of seconds" in caplog.text


def test_the_job_context_names_the_pods_container_and_sidecars_keep_their_ports() -> None:
    config = PodContainerConfig(socket=Path("/s"), node="/n", wait_s=1, pod="dynrunner-abc")
    assert PodJobContainer(config, log=print).job_context() == {"id": "dynrunner-abc/job", "network": ""}
    redis = ContainerSpec(name="redis", image="redis:7", ports=("6379", "8080:80"))
    assert sidecar_context([redis]) == {"redis": {"id": "", "network": "", "ports": {"6379": "6379", "80": "80"}}}


async def test_waiting_for_an_agent_that_never_listens_fails_in_time(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ContainerError, match=r"^The job container did not start: its agent did not answer at .* 0 s"):
        await wait_for_agent(tmp_path / "agent.sock", 0.3)
    assert loop.time() - started < 2


async def test_waiting_ends_once_the_socket_accepts(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"

    async def listen_later() -> asyncio.Server:
        await asyncio.sleep(0.2)
        return await asyncio.start_unix_server(lambda r, w: w.close(), str(path))

    later = asyncio.create_task(listen_later())
    await wait_for_agent(path, 5)
    server = await later
    server.close()
    await server.wait_closed()


class Slow:
    """A `JobContainerSource` whose start takes `delay` seconds, or fails with `error`."""

    processes: AgentProcesses | None = None
    image_env: dict[str, str] = {}
    node_mount = ""
    identity_reachable = True

    def __init__(self, delay: float = 0.0, error: BaseException | None = None) -> None:
        self.delay, self.error = delay, error

    async def start(self, job: ContainerSpec | None, services: Sequence[ContainerSpec]) -> None:
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error

    def job_context(self) -> dict[str, Any] | None:
        return None

    def services_context(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        return None


async def start(source: Slow, *, limit_s: float = 5, cancel: bool = False, shutdown: bool = False) -> Any:
    cancelled, stopping = asyncio.Event(), asyncio.Event()
    if cancel:
        asyncio.get_running_loop().call_later(0.05, cancelled.set)
    if shutdown:
        asyncio.get_running_loop().call_later(0.05, stopping.set)
    return await start_within(source, None, [], limit_s=limit_s, cancelled=cancelled, shutdown=stopping)


async def test_a_start_is_ended_by_a_cancel_the_runner_stopping_or_the_jobs_time() -> None:
    assert await start(Slow()) is None
    cancelled = await start(Slow(delay=60), cancel=True)
    assert (cancelled.result, cancelled.error) == (Result.CANCELLED, False)
    stopping = await start(Slow(delay=60), shutdown=True)
    assert (stopping.result, stopping.message) == (
        Result.FAILURE,
        "The runner is shutting down: the job's containers were not started.",
    )
    late = await start(Slow(delay=60), limit_s=0.1)
    assert late.message == "The job's containers did not start within the job's time (0 minutes)."
    failed = await start(Slow(error=ContainerError("The job container did not start: why")))
    assert (failed.result, failed.message, failed.error) == (
        Result.FAILURE,
        "The job container did not start: why",
        True,
    )
    with pytest.raises(RuntimeError, match="a bug"):
        await start(Slow(error=RuntimeError("a bug")))
