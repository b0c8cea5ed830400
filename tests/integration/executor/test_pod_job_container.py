"""A job with `container:` in a Kubernetes pool, from the executor's side: the Pod's `job`
container is the staged agent running as a local process (tests/fixtures/pod_agent.py), the
executor is told its socket (DYNRUNNER_JOB_CONTAINER_SOCKET) and runs every step through it,
with no podman; when the job ends it shuts the agent down, so the Pod would end
(docs/containers.md, "Pods: job containers")."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from dynrunner.proto.assignment import IdentityWait
from dynrunner.proto.containers import JOB_CONTAINER_NODE_ENV, JOB_CONTAINER_SOCKET_ENV
from dynrunner.proto.gitea import Result
from tests.fixtures.clients import ActionClients
from tests.fixtures.executor import Claimed, ExecutorHarness, process_gone, rows_of
from tests.fixtures.oidc import id_token_action
from tests.fixtures.pod_agent import IMAGE_PATH, PodJobContainer, pod_job_container
from tests.fixtures.workload_api import workload_api

IMAGE_ENV = {"PATH": IMAGE_PATH, "HOME": "/home/image", "IMAGE_VAR": "from the image", "FROM_CONTAINER_ENV": "pod"}
"""The job container's environment: the image's ENV and `container.env`, which the Pod sets."""

ACTIONS = {
    "js/action.yml": "name: js\ninputs:\n  who: {required: true}\nruns:\n  using: node20\n  main: main.js\n",
    "js/main.js": """
const fs = require('fs');
console.log(`node ${process.execPath} parent ${process.ppid} who=${process.env.INPUT_WHO}`);
fs.appendFileSync(process.env.GITHUB_OUTPUT, `greeting=hello ${process.env.INPUT_WHO}\\n`);
""",
    "composite/action.yml": """
name: composite
runs:
  using: composite
  steps:
    - run: echo "composite parent $PPID image var $IMAGE_VAR"
      shell: sh
""",
}

WORKFLOW = """
on: push
jobs:
  build:
    runs-on: self-hosted
    container:
      image: registry.example.com/ci/debian:12
      env:
        FROM_CONTAINER_ENV: pod
      credentials: {username: bot, password: pull-password-7}
    steps:
      - run: |
          echo "parent $PPID"
          echo "image var: $IMAGE_VAR; container env: $FROM_CONTAINER_ENV; home: $HOME"
          echo "executor only: ${EXECUTOR_ONLY:-unset}"
          echo "workspace is here: $([ "$(pwd)" = "$GITHUB_WORKSPACE" ] && echo yes)"
          echo "container ${{ job.container.id }} network [${{ job.container.network }}]"
          echo "pull-password-7"
      - shell: bash
        run: echo "bash ${BASH_VERSINFO[0]} parent $PPID"
      - id: js
        uses: ./js
        with:
          who: pod
      - uses: ./composite
      - shell: pwsh
        continue-on-error: true
        run: Write-Output "no pwsh here"
      - run: echo "after ${{ steps.js.outputs.greeting }}"
"""


@pytest.fixture
async def job_container(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[PodJobContainer]:
    async with pod_job_container(IMAGE_ENV) as job:
        monkeypatch.setenv(JOB_CONTAINER_SOCKET_ENV, str(job.socket))
        monkeypatch.setenv(JOB_CONTAINER_NODE_ENV, str(job.node))
        monkeypatch.setenv("DYNRUNNER_PODMAN", "/nonexistent/podman")  # a Pod has none
        monkeypatch.setenv("EXECUTOR_ONLY", "1")
        yield job


def in_pod(claimed: Claimed) -> Claimed:
    return dataclasses.replace(claimed, assignment=dataclasses.replace(claimed.assignment, backend="kubernetes"))


async def test_every_step_runs_in_the_job_container_with_its_environment(
    executor_harness: ExecutorHarness, job_container: PodJobContainer
) -> None:
    claimed = in_pod(await executor_harness.claim(WORKFLOW, files=ACTIONS))
    started = time.monotonic()
    assert await executor_harness.run(claimed.assignment) == 0
    took = time.monotonic() - started
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS, task.log_rows
    agent = str(job_container.process.pid)
    first = rows_of(task, 0)
    assert f"parent {agent}" in first
    assert "image var: from the image; container env: pod; home: /home/image" in first
    assert "executor only: unset" in first  # the executor's own environment stays out
    assert "workspace is here: yes" in first
    assert f"container {socket.gethostname()}/job network []" in first
    assert "***" in first and not any("pull-password-7" in row for row in task.log_rows)
    assert rows_of(task, 1)[-1] == f"bash 5 parent {agent}"
    assert f"node {job_container.node} parent {agent} who=pod" in rows_of(task, 2)
    assert f"composite parent {agent} image var from the image" in rows_of(task, 3)
    assert "##[error]shell `pwsh` was not found on PATH in the job container" in rows_of(task, 4)
    assert [s.status for s in task.steps] == ["success"] * 4 + ["failure", "success"]
    assert rows_of(task, 5)[-1] == "after hello pod"
    assert any(row.startswith("Job container started (") for row in task.log_rows)
    # The job's end shut the agent down: the Pod's `job` container would exit 0.
    assert await job_container.exited() == 0
    assert not job_container.socket.exists()
    print(f"job in a Pod's job container (6 steps): {took:.2f}s")


async def test_a_cancel_stops_the_step_in_the_container_and_always_steps_run(
    executor_harness: ExecutorHarness, job_container: PodJobContainer, tmp_path: Path
) -> None:
    pid_file, marker = tmp_path / "child.pid", tmp_path / "interrupted"
    workflow = f"""
on: push
jobs:
  cancel-me:
    runs-on: self-hosted
    container: debian:12
    steps:
      - run: |
          trap 'echo "INT in $PPID" > {marker}; kill $child; exit 130' INT
          sleep 300 & child=$!; echo $child > {pid_file}
          echo started
          wait
      - run: echo "not after a cancel"
      - if: always()
        run: echo "always ran, parent $PPID"
"""
    claimed = in_pod(await executor_harness.claim(workflow))
    running = asyncio.create_task(executor_harness.run(claimed.assignment))
    await executor_harness.wait_for_log(claimed.task_id, "started")
    started = time.monotonic()
    executor_harness.gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    assert time.monotonic() - started < 10
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert [s.status for s in task.steps] == ["cancelled", "skipped", "success"]
    assert marker.read_text() == f"INT in {job_container.process.pid}\n"  # SIGINT first, through the agent
    assert rows_of(task, 2)[-1] == f"always ran, parent {job_container.process.pid}"
    assert await job_container.exited() == 0
    assert process_gone(pid_file)


async def test_the_agent_is_shut_down_also_when_no_step_ran(
    executor_harness: ExecutorHarness, job_container: PodJobContainer
) -> None:
    """A job skipped by its `if:` never reaches its container: the executor still ends it."""
    workflow = """
on: push
jobs:
  build:
    if: false
    runs-on: self-hosted
    container: debian:12
    steps:
      - run: echo never
"""
    claimed = in_pod(await executor_harness.claim(workflow))
    assert await executor_harness.run(claimed.assignment) == 0
    assert executor_harness.gitea.task(claimed.task_id).result == Result.SKIPPED
    assert await job_container.exited() == 0


@pytest.fixture
def never_started(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="podjob-") as shared:
        path = Path(shared) / "agent.sock"
        monkeypatch.setenv(JOB_CONTAINER_SOCKET_ENV, str(path))
        monkeypatch.setenv("DYNRUNNER_PODMAN", "/nonexistent/podman")
        yield path


NEVER = """
on: push
jobs:
  build:
    runs-on: self-hosted
    container: registry.example.com/does-not-pull:1
    steps:
      - run: echo never
      - if: always()
        run: echo never either
"""

WAITING = "Waiting for the job container (registry.example.com/does-not-pull:1) to start"


async def test_a_job_container_that_never_starts_fails_the_job_clearly(
    executor_harness: ExecutorHarness, never_started: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNRUNNER_JOB_CONTAINER_WAIT_S", "1.5")
    claimed = in_pod(await executor_harness.claim(NEVER))
    started = time.monotonic()
    assert await executor_harness.run(claimed.assignment) == 0
    assert time.monotonic() - started < 15
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert WAITING in task.log_rows
    errors = [row for row in task.log_rows if row.startswith("##[error]")]
    assert errors[0].startswith(
        f"##[error]The job container did not start: its agent did not answer at {never_started} within 2 s"
    ), errors
    assert not any("never" in row for row in task.log_rows if not row.startswith("[command]"))


async def test_a_cancel_while_waiting_for_the_job_container_ends_the_job_at_once(
    executor_harness: ExecutorHarness, never_started: Path
) -> None:
    claimed = in_pod(await executor_harness.claim(NEVER))
    running = asyncio.create_task(executor_harness.run(claimed.assignment))
    await executor_harness.wait_for_log(claimed.task_id, WAITING)
    started = time.monotonic()
    executor_harness.gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    assert time.monotonic() - started < 10
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert "The job was cancelled while its containers started." in task.log_rows


async def test_steps_in_the_job_container_have_the_jobs_identity(
    executor_harness: ExecutorHarness, job_container: PodJobContainer, action_clients: ActionClients
) -> None:
    """The ID-token endpoint on the Pod's loopback reaches the job container's steps; the
    Workload API socket is not handed to them (the job's SPIRE entry names the `executor`
    container, so it would issue nothing to `job`)."""
    spiffe_id = "spiffe://example.org/ci/owner/repo/deploy"
    workflow = """
on: push
jobs:
  deploy:
    runs-on: self-hosted
    container: debian:12
    permissions:
      id-token: write
    steps:
      - uses: ./idtoken
        with:
          audience: sts.example
          out: {out}
      - run: echo "socket ${SPIFFE_ENDPOINT_SOCKET:-none} parent $PPID"
"""
    with tempfile.TemporaryDirectory(prefix="oidc-") as directory:
        api_socket = Path(directory) / "api.sock"
        out = Path(directory) / "token.jwt"
        identity = IdentityWait(enabled=True, workload_api_socket=str(api_socket), timeout_seconds=10)
        with workload_api(api_socket, [spiffe_id]) as api:
            claimed = in_pod(
                await executor_harness.claim(
                    workflow.replace("{out}", str(out)),
                    identity=identity,
                    spiffe_id=spiffe_id,
                    files=id_token_action(action_clients.root),
                )
            )
            assert await executor_harness.run(claimed.assignment) == 0
            token = out.read_text()
        task = executor_harness.gitea.task(claimed.task_id)
        assert task.result == Result.SUCCESS, task.log_rows
        assert api.jwt_requests == [(spiffe_id, ("sts.example",))]
        assert token.count(".") == 2 and not any(token in row for row in task.log_rows)
        assert rows_of(task, 1)[-1] == f"socket none parent {job_container.process.pid}"


async def test_a_called_workflows_job_container_is_refused_in_a_pod(
    self_hosted_actions: ExecutorHarness, job_container: PodJobContainer
) -> None:
    """The Pod has one job container, built for the calling job: a called job's own
    `container:` cannot run there (and the Pod's agent is still shut down at the end)."""
    gitea = self_hosted_actions.gitea
    gitea.create_repository("owner/repo", private=True)
    called = "on: workflow_call\njobs:\n  inner:\n    runs-on: x\n    container: alpine:3\n"
    called += "    steps:\n      - run: echo no\n"
    gitea.commit("owner/repo", {".gitea/workflows/called.yml": called})
    claimed = in_pod(
        await self_hosted_actions.claim("on: push\njobs:\n  call:\n    uses: ./.gitea/workflows/called.yml\n")
    )
    assert await self_hosted_actions.run(claimed.assignment) == 0
    task = self_hosted_actions.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert (
        "##[error]The job sets `container:` in a called workflow, which this runner does not run in Pod pools: "
        "the job's Pod has one job container, the calling job's. Run the called job in a local or VM pool."
    ) in task.log_rows, task.log_rows
    assert await job_container.exited() == 0


async def test_a_container_action_in_a_pod_job_container_is_refused_naming_the_pools(
    executor_harness: ExecutorHarness, job_container: PodJobContainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """podman is not used in a Pod (even where one is installed): a container action cannot run."""
    monkeypatch.delenv("DYNRUNNER_PODMAN")  # podman on PATH, where this machine has it
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    container: debian:12
    steps:
      - uses: docker://alpine:3
      - if: always()
        run: echo "still in the container, parent $PPID"
"""
    claimed = in_pod(await executor_harness.claim(workflow))
    assert await executor_harness.run(claimed.assignment) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert any(
        row.startswith("##[error]The action docker://alpine:3 is a Docker container action, which needs a container")
        and "container actions run in local and VM pools with podman installed" in row
        for row in rows_of(task, 0)
    ), rows_of(task, 0)
    assert rows_of(task, 1)[-1] == f"still in the container, parent {job_container.process.pid}"
