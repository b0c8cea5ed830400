"""Running the controller in tests: a config builder, an in-process runner, a subprocess runner,
and waits on the Gitea double's state (shared by tests/e2e and tests/integration/controller)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from dynrunner.controller.app import CLAIM_LOOPS, Controller
from dynrunner.controller.backends.base import Backend
from dynrunner.controller.config import ControllerConfig
from dynrunner.controller.sealing import ensure_key_file
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures import crash_points

FAKE_EXECUTOR = Path(__file__).resolve().parents[1] / "integration" / "controller" / "flow" / "fake_executor.py"
REAL_EXECUTOR = str(Path(sys.executable).parent / "dynrunner-executor")
DONE = {"success", "failure", "cancelled", "skipped"}


def fake_executor_command() -> list[str]:
    return [sys.executable, str(FAKE_EXECUTOR)]


def config_data(
    *,
    gitea_url: str,
    registration_token: str,
    state_dir: Path,
    nats_url: str | None,
    nats: dict[str, Any] | None = None,
    pools: Sequence[dict[str, Any]] | None = None,
    executor_command: Sequence[str] | None = None,
    max_concurrency: int = 4,
    labels: Sequence[str] = ("self-hosted", "local"),
    artifacts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A controller configuration (YAML keys) for tests: fast polling, metrics off, a sealing
    key under `state_dir` (made here, as an admin would for a controller with external NATS)."""
    ensure_key_file(state_dir / "sealing.key")
    command = list(executor_command or fake_executor_command())
    data: dict[str, Any] = {
        "gitea": {
            "url": gitea_url,
            "registrationToken": registration_token,
            "fetchIntervalSeconds": 0.05,
            "fetchIntervalMaxSeconds": 0.2,
        },
        "nats": {"url": nats_url, **(nats or {})},
        "pools": list(
            pools
            or [
                {
                    "name": "local",
                    "labels": list(labels),
                    "maxConcurrency": max_concurrency,
                    "backend": {"kind": "local", "executorCommand": command},
                }
            ]
        ),
        "metrics": {"address": ""},
        "logging": {"level": "info", "json": False},
        "stateDir": str(state_dir),
    }
    if artifacts is not None:
        data["artifacts"] = artifacts
    if nats_url is None:
        data["nats"].pop("url")
    return data


def build_config(**kwargs: Any) -> ControllerConfig:
    return ControllerConfig.model_validate(config_data(**kwargs))


def real_executor_config(gitea: GiteaDouble, nats_url: str, state_dir: Path, **kwargs: Any) -> ControllerConfig:
    """A controller for `gitea` whose local backend runs the real `dynrunner-executor`."""
    return build_config(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=state_dir,
        nats_url=nats_url,
        executor_command=[REAL_EXECUTOR],
        **kwargs,
    )


def recording_workflow(ran: Path, jobs: int = 1, *, sleep: float = 0, name: str = "job", suffix: str = "") -> str:
    """`jobs` parallel jobs, each appending `<name><i><suffix>` to `ran` and then sleeping: a
    record of which jobs ran, and how often, that outlives their environments."""
    body = "\n".join(
        f"""  {name}{i}:
    runs-on: [self-hosted, local]
    steps:
      - run: |
          echo "{name}{i}{suffix}" >> {ran}
          sleep {sleep}"""
        for i in range(jobs)
    )
    return f"on: push\njobs:\n{body}\n"


def recorded(ran: Path) -> list[str]:
    """What the jobs of `recording_workflow` appended so far."""
    return ran.read_text().splitlines() if ran.exists() else []


class InProcess:
    """A Controller running as a task of the test's event loop."""

    def __init__(self, cfg: ControllerConfig, backends: dict[str, Backend] | None = None) -> None:
        self.controller = Controller(cfg, backends=backends)
        self.stop_event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> InProcess:
        self.task = asyncio.create_task(self.controller.run(self.stop_event), name="controller-under-test")
        ready = asyncio.create_task(self.controller.ready.wait())
        done, _ = await asyncio.wait({self.task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if self.task in done:
            ready.cancel()
            await self.task  # raises the start-up error
        if ready not in done:
            ready.cancel()
            raise TimeoutError("controller did not become ready")
        return self

    async def stop(self) -> None:
        self.stop_event.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 60)


@contextlib.asynccontextmanager
async def in_process(cfg: ControllerConfig, backends: dict[str, Backend] | None = None) -> AsyncIterator[InProcess]:
    running = await InProcess(cfg, backends).start()
    try:
        yield running
    finally:
        await running.stop()


class Subprocess:
    """`dynrunner-controller run --config FILE` as a child process (for crash tests)."""

    def __init__(self, cfg_data: dict[str, Any], workdir: Path) -> None:
        self.config_file = workdir / "controller.yaml"
        self.config_file.write_text(yaml.safe_dump(cfg_data))
        self.log_file = workdir / "controller.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, crash: str | None = None) -> None:
        """`crash`: a point of `tests.fixtures.crash_points` where the process kills itself."""
        argv = [str(Path(sys.executable).parent / "dynrunner-controller"), "run", "--config", str(self.config_file)]
        env = os.environ
        if crash is not None:
            argv, env = crash_points.command(self.config_file, crash), crash_points.environment()
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"}
            )

    async def crashed(self, within: float = 60) -> None:
        """Wait for a controller started with `crash=` to have killed itself."""
        assert self.proc is not None
        status = await asyncio.to_thread(self.proc.wait, within)
        assert status == -signal.SIGKILL, f"exit status {status}: {self.log()[-3000:]}"

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, as a crash or an OOM kill."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    async def terminate(self, within: float = 60) -> int:
        """SIGTERM and wait without blocking the event loop (the Gitea double may run in it)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, within)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")


async def wait_for(
    predicate: Callable[[], Any], *, within: float = 30, interval: float = 0.05, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


async def wait_run_done(gitea: GiteaDouble, run_id: int, within: float = 60) -> Any:
    return await wait_for(
        lambda: (run := gitea.run(run_id)).status in DONE and run, within=within, what=f"run {run_id} to finish"
    )


def live_runners(gitea: GiteaDouble) -> list[Any]:
    return [r for r in gitea.runners() if not r.deleted]


async def wait_armed(gitea: GiteaDouble, pools: int = 1) -> None:
    """Until every claim loop polls Gitea with an armed runner. Call it before stopping a
    controller whose runners `assert_only_armed_runners(kills=…)` will count: a loop that has
    just registered a runner in place of a spent one has not polled with it yet, and would
    pass for the never-used runner a kill leaves behind."""
    await wait_for(
        lambda: len([r for r in live_runners(gitea) if r.last_online]) >= CLAIM_LOOPS * pools,
        within=10,
        what="every claim loop polling with its armed runner",
    )


def assert_only_armed_runners(gitea: GiteaDouble, pools: int = 1, *, kills: int = 0) -> None:
    """No registration piled up: what Gitea still lists is exactly the armed runner of each
    claim loop (kept for the next claim), and none of them holds a task. A controller killed
    (`kills` times) may have left, per claim loop, one runner it registered but had not stored
    yet (the Register→store window of docs/operations.md): never used, so never online."""
    runners = live_runners(gitea)
    unstored = [r for r in runners if r.last_online == 0] if kills else []
    assert len(unstored) <= kills * CLAIM_LOOPS * pools, unstored
    runners = [r for r in runners if r not in unstored]
    assert len(runners) == CLAIM_LOOPS * pools, runners
    assert all(r.ephemeral for r in runners)
    busy = {job.task_id and gitea.task(job.task_id).runner_id for run in gitea.runs() for job in run.jobs}
    assert not busy & {r.id for r in runners}, "an armed runner holds a task"
