"""End to end on the kubernetes backend, `container:`: the controller gives the job's Pod an
init container that stages the agent and Node from the executor image into an `emptyDir`, and
a `job` container (the job image) running that agent; the executor runs every step through it
(docs/containers.md, "Pods: job containers"). The kubelet double runs it all as local
processes (tests/fixtures/pod_job_containers.py): the steps see the job image's environment and
the container spec's `env`, the workspace at the executor's path, a service on `localhost`
started before the first step, the executor's ID-token endpoint; Node and composite actions
run there too; a cancel stops a step there and the `always()` step still runs; an unhealthy
service fails the job naming it; a job whose agent cannot be staged, or whose executor is
killed before it ends the agent, fails with the reason. Every Pod's agent (PID 1 of `job`) is
ended by the executor's `shutdown` request or by the Pod's deletion, and nothing is left: no
Pod, Secret (the pull Secret too) or ClusterStaticEntry, no agent process, no step process."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.kubernetes.cluster import Cluster
from tests.fixtures import redis_like
from tests.fixtures.action_bundles import greeting_action
from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.harness import first_job_log, in_process, wait_for, wait_run_done
from tests.fixtures.kubernetes_backend import (
    IMAGE,
    ObjectLog,
    all_reaped,
    executor_image,
    kube_controller_config,
)
from tests.fixtures.pod_job_containers import (
    IMAGE_MARK,
    JOB_IMAGE,
    REDIS,
    agent_processes,
    job_container_cluster_options,
    processes_running,
)

NODE_ACTION = {
    "action.yml": "inputs:\n  who:\n    required: true\noutputs:\n  said:\n    description: x\n"
    "runs:\n  using: node20\n  main: main.js\n",
    "main.js": """
const fs = require('fs');
const parent = fs.readFileSync(`/proc/${process.ppid}/comm`, 'utf8').trim();
const node = process.execPath.endsWith('/node/bin/node') ? 'the staged node' : process.execPath;
console.log(`node action for ${process.env.INPUT_WHO}: ${node}, parent ${parent}, image ${process.env.IMAGE_MARK}`);
fs.appendFileSync(process.env.GITHUB_OUTPUT, `said=hello ${process.env.INPUT_WHO}\\n`);
""",
}
COMPOSITE_ACTION = {
    "action.yml": greeting_action(
        """
echo "composite step under $(cat /proc/$PPID/comm) sees $IMAGE_MARK"
echo "text=greeted ${{ inputs.who }}" >> "$GITHUB_OUTPUT"
"""
    ),
}
PROBE = f"python {redis_like.__file__} probe {{port}}"


def workflow(port: int, health: str) -> str:
    return f"""
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    permissions:
      id-token: write
    container:
      image: {JOB_IMAGE}
      env:
        FROM_SPEC: set by the container's env
      credentials:
        username: ci
        password: registry-password
    services:
      redis:
        image: {REDIS}
        options: --health-cmd "{health}" --health-interval 1s --health-retries 10
    steps:
      - run: |
          echo "image: $IMAGE_MARK"
          echo "spec: $FROM_SPEC"
          echo "parent: $(cat /proc/$PPID/comm)"
          if [ "$PWD" = "$GITHUB_WORKSPACE" ]; then echo "cwd is the workspace"; fi
          echo "container ${{{{ job.container.id }}}}"
          echo "from the first step" > shared.txt
          python3 - <<'PY'
          import socket
          with socket.create_connection(("localhost", {port}), 2) as s:
              s.sendall(b"PING\\r\\n")
              print("service answered", s.recv(64).decode().strip())
          PY
      - id: node
        uses: acme/hello-node@v1
        with:
          who: pods
      - id: greet
        uses: acme/greet@v1
        with:
          who: ${{{{ steps.node.outputs.said }}}}
      - run: echo "${{{{ steps.greet.outputs.said }}}}; the workspace has $(cat shared.txt)"
      - run: |
          python3 - <<'PY'
          import base64, json, os, urllib.request
          url = os.environ["ACTIONS_ID_TOKEN_REQUEST_URL"] + "&audience=sts.example"
          bearer = {{"Authorization": "Bearer " + os.environ["ACTIONS_ID_TOKEN_REQUEST_TOKEN"]}}
          token = json.load(urllib.request.urlopen(urllib.request.Request(url, headers=bearer), timeout=10))["value"]
          part = token.split(".")[1]
          claims = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
          print("ID token for", claims["sub"], "audience", claims["aud"])
          PY
"""


CANCELLED = f"""
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    container: {JOB_IMAGE}
    steps:
      - run: echo "sleeping under $(cat /proc/$PPID/comm)"; sleep 613
      - if: always()
        run: echo "always ran under $(cat /proc/$PPID/comm)"
"""


@pytest.fixture
def job_cluster(kube_cluster_factory: Any, tmp_path: Path, service_port: int) -> Iterator[Cluster]:
    with kube_cluster_factory(**job_container_cluster_options(tmp_path, service_port)) as cluster:
        yield cluster


@pytest.fixture
async def actions_gitea(gitea_factory: GiteaFactory, gitea_profile: str) -> AsyncIterator[GiteaDouble]:
    """A Gitea double serving `owner/repo@ref` actions itself, with a Node and a composite one."""
    async with gitea_factory(default_actions_url="self", profile=gitea_profile) as gitea:
        for name, files in (("acme/hello-node", NODE_ACTION), ("acme/greet", COMPOSITE_ACTION)):
            gitea.create_repository(name)
            gitea.commit(name, files, tags=["v1"])
        yield gitea


async def nothing_left(cluster: Cluster, running: Any) -> None:
    await all_reaped(cluster, running)
    await wait_for(lambda: not agent_processes(cluster), within=10, what="no agent process left")


def final(versions: list[dict[str, Any]]) -> dict[str, Any]:
    """The Pod's last version in a final phase (the controller may delete it as soon as its
    executor ended: the Pod may end before or after that delete)."""
    done = [v for v in versions if (v.get("status") or {}).get("phase") in ("Succeeded", "Failed")]
    assert done, [(v["type"], (v.get("status") or {}).get("phase")) for v in versions]
    return done[-1]


def shut_down(cluster: Cluster, pod: dict[str, Any]) -> bool:
    """The executor's own log says the agent took its `shutdown` (the executor's container
    log stays in the kubelet double's Pod directory after the Pod is gone)."""
    log = next(cluster.root.rglob(f"pods/{pod['metadata']['uid']}/logs/executor.log"))
    return "the job container's agent shut down" in log.read_text()


def executor_logs(cluster: Cluster) -> str:
    return "\n".join(path.read_text() for path in cluster.root.rglob("pods/*/logs/executor.log"))


def container_state(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s["state"] for s in pod["status"]["containerStatuses"] if s["name"] == name)


async def test_steps_and_actions_run_in_the_job_container_beside_a_service(
    actions_gitea: GiteaDouble, nats_url: str, job_cluster: Cluster, tmp_path: Path, service_port: int
) -> None:
    gitea = actions_gitea
    with ObjectLog(job_cluster.api) as seen:
        async with in_process(kube_controller_config(gitea, nats_url, job_cluster, tmp_path)) as running:
            run = gitea.submit("acme/app", workflow(service_port, PROBE.format(port=service_port)))
            done = await wait_run_done(gitea, run.id, within=120)
            text = first_job_log(gitea, run.id)
            assert done.status == "success", text
            await nothing_left(job_cluster, running)
    [(name, versions)] = seen.pods.items()
    assert f"image: {IMAGE_MARK}" in text, text
    assert "spec: set by the container's env" in text, text
    assert "parent: dynrunner-agent" in text, text  # the step's shell is the agent's child
    assert "cwd is the workspace" in text, text
    # `<pod name>/job`; the executor takes the Pod's name from its hostname, which the double
    # (no UTS namespace) leaves the machine's: only the container's part is checked here.
    assert re.search(r"^container \S+/job$", text, re.MULTILINE), text
    assert "service answered +PONG" in text, text
    assert f"node action for pods: the staged node, parent dynrunner-agent, image {IMAGE_MARK}" in text, text
    assert f"composite step under dynrunner-agent sees {IMAGE_MARK}" in text, text
    assert "greeted hello pods; the workspace has from the first step" in text, text
    # The executor's ID-token endpoint on the Pod's loopback answers a step in `job`.
    assert "ID token for spiffe://example.org/ci/acme/app/build audience sts.example" in text, text

    spec = versions[0]["spec"]
    assert spec["initContainers"][0]["name"] == "dynrunner-agent-install"
    assert spec["initContainers"][0]["command"] == ["dynrunner-executor", "stage-agent", "/__dynrunner"]
    assert [c["name"] for c in spec["containers"]] == ["executor", "job"]
    job = spec["containers"][1]
    assert job["image"] == JOB_IMAGE
    assert job["command"] == ["/__dynrunner/dynrunner-agent", "/__dynrunner/agent.sock"]
    assert {"name": "FROM_SPEC", "value": "set by the container's env"} in job["env"]
    assert {"name": f"{name}-pull"} in spec["imagePullSecrets"]
    last = final(versions)
    assert last["status"]["phase"] == "Succeeded", last["status"]
    assert container_state(last, "job")["terminated"]["exitCode"] == 0
    assert container_state(last, "executor")["terminated"]["exitCode"] == 0
    assert shut_down(job_cluster, last)


async def sleeping_step(gitea: GiteaDouble) -> Any:
    """Submit CANCELLED; its run once the step sleeps in the job container."""
    run = gitea.submit("acme/app", CANCELLED)
    await wait_for(
        lambda: "sleeping under dynrunner-agent" in first_job_log(gitea, run.id), within=90, what="the step runs"
    )
    return run


@pytest.mark.parametrize("gitea_profile", ["1.26", "main"])
async def test_a_cancel_stops_the_step_in_the_job_container_and_runs_the_always_step(
    gitea: GiteaDouble, nats_url: str, job_cluster: Cluster, tmp_path: Path
) -> None:
    with ObjectLog(job_cluster.api) as seen:
        async with in_process(kube_controller_config(gitea, nats_url, job_cluster, tmp_path)) as running:
            run = await sleeping_step(gitea)
            assert processes_running("sleep 613"), "the step's sleep runs"
            gitea.cancel_run(run.id)
            done = await wait_run_done(gitea, run.id, within=60)
            assert done.status == "cancelled", first_job_log(gitea, run.id)
            # Gitea main takes the always() step's lines; 1.26 ended the task at the cancel, so
            # they go to the executor's own log only (tests/e2e/test_cancellation.py).
            await wait_for(
                lambda: "always ran under dynrunner-agent" in first_job_log(gitea, run.id) + executor_logs(job_cluster),
                within=60,
                what="the always() step, in the job container",
            )
            assert not processes_running("sleep 613"), "the cancel stopped the step before the always() step"
            await nothing_left(job_cluster, running)
    assert not processes_running("sleep 613")
    [versions] = seen.pods.values()
    last = final(versions)
    assert container_state(last, "job")["terminated"]["exitCode"] == 0, last["status"]
    assert shut_down(job_cluster, last)


async def test_an_unhealthy_service_fails_the_job_naming_it(
    gitea: GiteaDouble, nats_url: str, job_cluster: Cluster, tmp_path: Path, service_port: int
) -> None:
    async with in_process(kube_controller_config(gitea, nats_url, job_cluster, tmp_path)) as running:
        run = gitea.submit("acme/app", workflow(service_port, "echo not ready; exit 1"))
        done = await wait_run_done(gitea, run.id, within=90)
        text = first_job_log(gitea, run.id)
        assert done.status == "failure", text
        assert "Service 'redis' is unhealthy" in text, text
        assert "Startup probe failed: not ready" in text, text
        assert "service answered" not in text, text
        await nothing_left(job_cluster, running)


async def test_an_executor_image_without_the_agent_fails_the_job_saying_so(
    gitea: GiteaDouble, nats_url: str, kube_cluster_factory: Any, tmp_path: Path
) -> None:
    """The init container `dynrunner-agent-install` fails (no agent in the executor image):
    the Pod fails before its executor starts, and the controller finalizes the task with the
    init container's reason in the job log."""
    options = job_container_cluster_options(tmp_path)
    options["images"][IMAGE] = executor_image(tmp_path / "home")  # this environment's executor, no agent
    with kube_cluster_factory(**options) as cluster:
        async with in_process(kube_controller_config(gitea, nats_url, cluster, tmp_path)) as running:
            run = gitea.submit("acme/app", CANCELLED.replace("sleep 613", "true"))
            done = await wait_run_done(gitea, run.id, within=90)
            text = first_job_log(gitea, run.id)
            assert done.status == "failure", text
            assert "the agent for the job container could not be installed: dynrunner-agent-install" in text, text
            assert "the container agent (dynrunner-agent, `make agent`) is not installed here" in text, text
            assert "sleeping under" not in text, text
            await nothing_left(cluster, running)


async def test_an_executor_killed_before_its_shutdown_leaves_no_job_container_behind(
    gitea: GiteaDouble, nats_url: str, job_cluster: Cluster, tmp_path: Path
) -> None:
    """The executor is OOM-killed mid-step, so no `shutdown` reaches the agent: the Pod stays
    Running with its `job` container; the controller goes by the executor's container, finalizes
    the task with the reason, and deletes the Pod, which ends the agent and the step."""
    with ObjectLog(job_cluster.api) as seen:
        async with in_process(kube_controller_config(gitea, nats_url, job_cluster, tmp_path)) as running:
            run = await sleeping_step(gitea)
            [name] = seen.pods
            job_cluster.oom_kill("ci-jobs", name, "executor")
            done = await wait_run_done(gitea, run.id, within=60)
            await wait_for(lambda: "ran out of memory" in first_job_log(gitea, run.id), within=30, what="the diagnosis")
            text = first_job_log(gitea, run.id)
            assert done.status == "failure", text
            assert "[dynrunner] the job failed: the job ran out of memory: the executor was OOMKilled" in text, text
            await nothing_left(job_cluster, running)
    assert not processes_running("sleep 613")
    states = [
        {s["name"]: s["state"] for s in (v.get("status") or {}).get("containerStatuses") or []} for v in seen.pods[name]
    ]
    assert any("terminated" in s.get("executor", {}) and "running" in s.get("job", {}) for s in states), (
        "the job container outlived the executor until the Pod was deleted"
    )
