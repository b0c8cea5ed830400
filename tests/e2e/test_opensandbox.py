"""End to end on a `vm` pool (issue 13's proof): the controller runs each job in a microVM of
the OpenSandbox double, which boots the VM image's entrypoint (vm/entrypoint.sh) as a process;
the SPIRE Server API double mints the VM's join token, the in-VM agent double joins with it
and serves the Workload API, and the real executor waits for exactly its SVID before it runs
the job against the Gitea double."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.app import Controller
from dynrunner.controller.backends.opensandbox.backend import OpenSandboxBackend
from dynrunner.controller.backends.opensandbox.builders import STATE_FILE, deadline_of
from dynrunner.controller.config.model import ControllerConfig
from dynrunner.controller.demo import Demo, default_examples
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.gitea.views import RunView, TaskView
from dynrunner.doubles.opensandbox.sandboxes import Sandbox
from dynrunner.proto.gitea import Result, TaskState
from tests.fixtures.executor import rows_of
from tests.fixtures.harness import (
    Subprocess,
    assert_only_armed_runners,
    config_data,
    in_process,
    recorded,
    recording_workflow,
    wait_for,
    wait_run_done,
)
from tests.fixtures.opensandbox_backend import VmWorld, vm_world

pytestmark = pytest.mark.slow


def vm_workflow(workflow: str) -> str:
    return workflow.replace("[self-hosted, local]", "[self-hosted, vm]")


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[VmWorld]:
    (tmp_path / "vm").mkdir()
    async with vm_world(tmp_path / "vm") as made:
        yield made


@contextlib.asynccontextmanager
async def sandboxes_seen(world: VmWorld) -> AsyncIterator[set[str]]:
    """The ids of every sandbox that existed while the block ran (looked at every 20 ms)."""
    seen: set[str] = set()

    async def look() -> None:
        while True:
            seen.update(box.id for box in world.osb.sandboxes.all())
            await asyncio.sleep(0.02)

    looking = asyncio.create_task(look())
    try:
        yield seen
    finally:
        looking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await looking


def nothing_left(world: VmWorld) -> bool:
    """No sandbox, no SPIRE agent and no entry of any job remains."""
    return not world.osb.listed() and not world.spire.agent_ids() and not world.spire.state.entries.entries()


class VmDemo(Demo):
    """`make demo`'s examples (docs/examples), each job on the `vm` pool instead of `local`."""

    def __init__(self, world: VmWorld) -> None:
        super().__init__(default_examples(), keep=False)
        self.world = world
        for example in self.examples:
            example.workflow = vm_workflow(example.workflow)

    async def _remove_leftovers(self, controller: Controller) -> None:
        """Nothing: the test checks that the reaper left nothing (the demo's own sweep would use
        the pool's backend after the controller closed its client)."""

    def _config(self, url: str, token: str, executor: str) -> ControllerConfig:
        # The double's VMs share the host's disk: this directory stands for a volume mounted
        # into every VM (the only way a Filesystem store works across VMs; docs/opensandbox.md).
        (self.workdir / "artifacts").mkdir()
        return ControllerConfig.model_validate(
            {
                "gitea": {"url": url, "registrationToken": token, "fetchIntervalSeconds": 0.1},
                "pools": [self.world.pool()],
                "identity": self.world.identity(),
                "artifacts": {"driver": "Filesystem", "path": str(self.workdir / "artifacts")},
                "metrics": {"address": ""},
                "logging": {"json": False},
                "stateDir": str(self.workdir / "controller"),
            }
        )


async def test_the_demo_examples_run_in_microvms_each_with_its_identity(
    world: VmWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = VmDemo(world)
    async with sandboxes_seen(world) as seen:
        status = await demo.run()
    out = capsys.readouterr().out
    assert status == 0, out[-8000:]
    assert "every result is the expected one" in out
    jobs = sum(len(example.jobs) for example in demo.examples)
    assert "[dynrunner] claimed by pool vm" in out
    assert len(seen) >= jobs - 1, (len(seen), jobs)  # one VM per job that ran (a cancelled one may not)
    await wait_for(lambda: nothing_left(world), within=30, what="every VM, agent and entry removed")


async def test_a_controller_killed_after_create_before_the_ack_runs_the_job_once_in_one_vm(
    gitea: GiteaDouble, nats_url: str, world: VmWorld, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.log"
    data: dict[str, Any] = config_data(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "state",
        nats_url=nats_url,
        nats={"ackWaitSeconds": 4.0},
        pools=[world.pool()],
    )
    data["identity"] = world.identity()
    controller = Subprocess(data, tmp_path)
    run = gitea.submit("owner/repo", vm_workflow(recording_workflow(ran)))
    async with sandboxes_seen(world) as seen:
        try:
            controller.start(crash="before-ack")
            await controller.crashed()
            [box] = world.osb.listed()
            assert box.metadata["dynrunner-stage"] == "staged" and recorded(ran) == []  # in the VM, not started

            controller.start()
            done = await wait_run_done(gitea, run.id, within=90)
            await wait_for(lambda: nothing_left(world), within=30, what="the VM, its agent and entries removed")
            assert await controller.terminate() == 0
        finally:
            if controller.proc is not None and controller.proc.poll() is None:
                controller.kill()
    log = controller.log()
    assert done.status == "success", log[-3000:]
    assert recorded(ran) == ["job0"]
    assert seen == {box.id}, "one VM for the job, made before the crash and used after it"
    assert_only_armed_runners(gitea, kills=1)


async def test_a_vm_that_expired_mid_job_fails_its_task_with_the_reason(
    gitea: GiteaDouble, nats_url: str, world: VmWorld, tmp_path: Path
) -> None:
    """The controller was away longer than the lease (here: the double's clock jumps past it,
    and the backend reads that clock): OpenSandbox removed the VM, and the task is finalized
    failed saying so, from the finalize record."""
    ran = tmp_path / "ran.log"
    cfg = ControllerConfig.model_validate(
        {
            **config_data(
                gitea_url=gitea.url,
                registration_token=gitea.registration_token,
                state_dir=tmp_path / "state",
                nats_url=nats_url,
                pools=[world.pool(leaseSeconds=600)],
            ),
            "identity": world.identity(),
        }
    )
    backend = OpenSandboxBackend.from_config(cfg.pools[0], cfg, clock=world.osb.clock.now)
    async with in_process(cfg, backends={"vm": backend}):
        run = gitea.submit("owner/repo", vm_workflow(recording_workflow(ran, sleep=300)))
        await wait_for(lambda: recorded(ran), within=60, what="the job's step running")
        assert await world.osb.advance(601)
        done = await wait_run_done(gitea, run.id, within=30)
        await wait_for(lambda: nothing_left(world), within=30, what="the VM's agent and entries removed")
    assert done.status == "failure"
    rows = gitea.task(done.jobs[0].task_id).log_rows
    [failed] = [row for row in rows if "the job failed" in row]
    assert "the job failed: The job's VM expired at" in failed and "not renewed in time" in failed, rows[-5:]
    assert failed.endswith("[vanished]"), failed
    assert rows[-1].startswith(("[dynrunner] Running", "[dynrunner] Stopping"))  # the VM as last seen
    # No row names the sandbox: its id opens its execd through the server's proxy route.
    assert [row for row in rows if any(sandbox_id in row for sandbox_id in world.osb.sandboxes.created)] == []
    assert_only_armed_runners(gitea)


THREE_STEPS = """
on: push
jobs:
  build:
    runs-on: [self-hosted, vm]
    timeout-minutes: 1
    steps:
      - run: echo built
      - run: |
          echo "job started" >> {ran}
          sleep 300
      - run: echo never
"""


async def _second_step_started(gitea: GiteaDouble, world: VmWorld, ran: Path) -> tuple[RunView, Sandbox]:
    """Submit THREE_STEPS; return its run and VM once Gitea accepted step 2's start."""
    run = gitea.submit("owner/repo", THREE_STEPS.format(ran=ran))
    await wait_for(lambda: recorded(ran), within=60, what="the job's second step running")
    [box] = world.osb.listed()
    await wait_for(lambda: second_step_kept(box.rootfs), within=30, what="the second step's start accepted")
    return run, box


def _first_step_kept(gitea: GiteaDouble, done: Any, reason: str) -> TaskView:
    """The run failed with `reason` in its log and step 1's success kept (step 2 cancelled,
    step 3 skipped); only the armed runners are left."""
    assert done.status == "failure"
    task = gitea.task(done.jobs[0].task_id)
    assert any(reason in row for row in task.log_rows), task.log_rows[-5:]
    assert [step.status for step in task.steps] == ["success", "cancelled", "skipped"], task.steps
    assert "built" in rows_of(task, 0)
    assert_only_armed_runners(gitea)
    return task


def vm_controller(
    gitea: GiteaDouble, nats_url: str, world: VmWorld, tmp_path: Path
) -> tuple[ControllerConfig, OpenSandboxBackend]:
    """A controller's configuration for the world's VM pool, and its backend on the double's clock."""
    cfg = ControllerConfig.model_validate(
        {
            **config_data(
                gitea_url=gitea.url,
                registration_token=gitea.registration_token,
                state_dir=tmp_path / "state",
                nats_url=nats_url,
                pools=[world.pool()],
            ),
            "identity": world.identity(),
        }
    )
    return cfg, OpenSandboxBackend.from_config(cfg.pools[0], cfg, clock=world.osb.clock.now)


async def test_a_vm_stopped_past_its_deadline_after_its_first_step_shows_that_step_succeeded(
    gitea: GiteaDouble, nats_url: str, world: VmWorld, tmp_path: Path
) -> None:
    """Issue 18 item 7: a job the controller ends while its VM still runs (the executor ran
    past the job's deadline: the double's clock jumps past it) is finalized with the steps
    Gitea last accepted, read through execd before the VM is deleted: step 1 succeeded, step 2
    cancelled, step 3 skipped (every step was cancelled)."""
    ran = tmp_path / "ran.log"
    cfg, backend = vm_controller(gitea, nats_url, world, tmp_path)
    async with in_process(cfg, backends={"vm": backend}):
        run, box = await _second_step_started(gitea, world, ran)
        deadline = deadline_of(box.metadata)
        assert deadline is not None
        await world.osb.advance((deadline - world.osb.clock.now()).total_seconds() + 90)
        done = await wait_run_done(gitea, run.id, within=30)
        await wait_for(lambda: nothing_left(world), within=30, what="the VM removed")
    _first_step_kept(gitea, done, "The job ran past its deadline")


def second_step_kept(rootfs: Path) -> bool:
    """The executor in the VM keeps step 1 succeeded and step 2 started in its state file."""
    path = rootfs / STATE_FILE.lstrip("/")
    try:
        state = TaskState.decode(path.read_bytes())
    except (OSError, ValueError):
        return False
    return len(state.steps) > 1 and state.steps[1].started_at is not None and state.steps[0].result is Result.SUCCESS


async def test_a_vm_whose_executor_was_killed_after_its_first_step_shows_that_step_succeeded(
    gitea: GiteaDouble, nats_url: str, world: VmWorld, tmp_path: Path
) -> None:
    """Issue 18 item 7: the executor in a VM is killed (SIGKILL, as the OOM killer does) after
    Gitea accepted step 1's success and step 2's start. The entrypoint exits, the VM ends and
    execd with it; the state it printed on the console gives the reaper the steps: step 1
    succeeded, step 2 cancelled, step 3 skipped (every step was cancelled)."""
    ran = tmp_path / "ran.log"
    cfg, backend = vm_controller(gitea, nats_url, world, tmp_path)
    async with in_process(cfg, backends={"vm": backend}):
        run, box = await _second_step_started(gitea, world, ran)
        assert box.process is not None
        [executor] = executors_under(box.process.pid)
        os.kill(executor, signal.SIGKILL)
        done = await wait_run_done(gitea, run.id, within=60)
        await wait_for(lambda: nothing_left(world), within=30, what="the VM removed")
    task = _first_step_kept(gitea, done, "killed by SIGKILL")
    assert not any("dynrunner-accepted-state" in row for row in task.log_rows)


def executors_under(root: int) -> list[int]:
    """The executor processes (`… run --assignment …`) among the descendants of `root`."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit():
            parent = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        with contextlib.suppress(OSError):
            argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
            if b"--assignment" in argv and b"run" in argv:
                found.append(pid)
    return found
