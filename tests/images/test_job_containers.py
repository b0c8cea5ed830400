"""Job containers, services and container actions with podman (a local pool), end to end
through the Gitea double: images built from the debootstrap base, the agent built from agent/.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.gitea.views import TaskView
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.harness import in_process, real_executor_config, wait_run_done
from tests.fixtures.images import Engine
from tests.fixtures.job_images import JobImages, leftovers

BUILD = "on: push\njobs:\n  build:\n    runs-on: self-hosted\n"
"""The head of a one-job workflow on a plain self-hosted runner; each test adds the job's keys."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(autouse=True)
def nothing_left(engine: Engine, podman_env: dict[str, str]) -> Iterator[None]:
    """Every test here runs with podman and ends with no container of a job left in it."""
    yield
    assert leftovers(engine) == []


async def cancelled_once_logged(harness: ExecutorHarness, workflow: str, row: str, *, within: float) -> TaskView:
    """Run `workflow`, cancel its run once its log has the row `row`, and return its task once
    the executor ended (within `within` seconds of the cancel)."""
    claimed = await harness.claim(workflow)
    run = asyncio.create_task(harness.run(claimed))
    await harness.wait_for_log(claimed.task_id, row, timeout_s=120)
    harness.gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(run, within) == 0
    return harness.gitea.task(claimed.task_id)


async def test_steps_run_in_a_shell_only_job_container_with_a_node_and_a_composite_action(
    executor_harness: ExecutorHarness, job_images: JobImages
) -> None:
    workflow = (
        BUILD
        + f"""\
    container:
      image: {job_images.shell_only}
      env:
        FROM_CONTAINER: set-by-container-env
    steps:
      - name: where
        run: |
          echo "bash=$(command -v bash || echo none) os=$(. /etc/os-release; echo $ID)"
          echo "env=$FROM_CONTAINER home=$HOME ws=$GITHUB_WORKSPACE pwd=$(pwd)"
          echo "hello" > "$GITHUB_WORKSPACE/made-in-container"
          echo "greeting=hi from the container" >> "$GITHUB_OUTPUT"
          echo "LATER=from-github-env" >> "$GITHUB_ENV"
        id: where
      - uses: ./node-action
        with:
          who: ${{{{ steps.where.outputs.greeting }}}}
      - uses: ./composite-action
      - name: bash is not there
        continue-on-error: true
        shell: bash
        run: echo never
      - name: job context
        run: echo "container id set=${{{{ job.container.id != '' }}}} later=$LATER"
"""
    )
    files = {
        "node-action/action.yml": "name: n\ninputs:\n  who: {}\nruns:\n  using: node20\n  main: main.js\n",
        "node-action/main.js": (
            "const fs = require('fs');\n"
            "console.log(`node ${process.version} says ${process.env.INPUT_WHO}`);\n"
            "console.log(`node sees ${fs.readFileSync('/etc/os-release','utf8').match(/^ID=(.*)$/m)[1]}`);\n"
        ),
        "composite-action/action.yml": (
            "name: c\nruns:\n  using: composite\n  steps:\n"
            '    - run: echo "composite in $(cat $GITHUB_WORKSPACE/made-in-container)"\n      shell: sh\n'
        ),
    }
    view = await executor_harness.run_job(workflow, files=files)
    rows = "\n".join(view.log_rows)
    assert view.result == Result.SUCCESS, rows
    assert [s.status for s in view.steps] == ["success", "success", "success", "failure", "success"]
    assert "shell: /usr/bin/sh -e {0}" in rows  # no bash in the image: the default shell is its sh
    assert "bash=none os=debian" in rows
    assert "env=set-by-container-env home=/root" in rows
    assert "node v20" in rows and "says hi from the container" in rows and "node sees debian" in rows
    assert "composite in hello" in rows
    assert "##[error]shell `bash` was not found on PATH in the job container" in rows
    assert "container id set=true later=from-github-env" in rows


async def test_a_redis_service_is_reachable_by_name_and_localhost_before_the_first_step(
    executor_harness: ExecutorHarness, job_images: JobImages
) -> None:
    probe = "exec 3<>/dev/tcp/$1/6379; printf 'PING\\r\\n' >&3; read -r answer <&3; echo \"$1 answered $answer\""
    workflow = (
        BUILD
        + f"""\
    container: {job_images.bash}
    services:
      redis:
        image: {job_images.redis}
        options: --health-cmd "redis-cli ping" --health-interval 2s --health-retries 10
    steps:
      - shell: bash
        run: |
          set -- redis; {probe}
          set -- localhost; {probe}
          echo "port in context: ${{{{ job.services.redis.id != '' }}}}"
"""
    )
    view = await executor_harness.run_job(workflow)
    rows = "\n".join(view.log_rows)
    assert view.result == Result.SUCCESS, rows
    assert "Service redis is healthy" in rows
    assert "redis answered +PONG\r" in rows or "redis answered +PONG" in rows
    assert "localhost answered +PONG" in rows


NEVER_STARTS = (
    BUILD
    + """\
{containers}    steps:
      - run: echo never
"""
)
"""A job whose containers `{containers}` (indented as job keys; `{redis}` and `{bash}` name
those images) keep its one step from running."""

CONTAINERS_REFUSED: dict[str, tuple[str, list[str]]] = {
    "unhealthy-service": (
        """    services:
      broken:
        image: {redis}
        options: --health-cmd "echo probe says no; exit 1" --health-interval 1s --health-retries 2
""",
        [
            "##[error]Service 'broken' is unhealthy: its health check `echo probe says no; exit 1` still failed "
            "after 2 s (exit code 1).",
            "##[error]probe says no",
            "Ready to accept connections",  # the service's own last output
        ],
    ),
    "service-exits": (
        """    services:
      crashing:
        image: {bash}
        options: >-
          --entrypoint '["/bin/sh", "-c", "echo crashed: $WHY; exit 3"]' --health-cmd false
          --health-interval 1s --health-retries 30 -e WHY=oops
""",
        ["##[error]Service 'crashing' is unhealthy: it exited with code 3.", "##[error]crashed: oops"],
    ),
    "options-outside-the-subset": (
        """    container:
      image: {bash}
      options: --privileged
""",
        ["##[error]`container`: `--privileged` is not supported in `options` (supported: --user,"],
    ),
}


@pytest.mark.parametrize("case", list(CONTAINERS_REFUSED))
async def test_containers_that_cannot_serve_the_job_fail_it_saying_why(
    executor_harness: ExecutorHarness, job_images: JobImages, case: str
) -> None:
    containers, expected = CONTAINERS_REFUSED[case]
    images = {"redis": job_images.redis, "bash": job_images.bash}
    view = await executor_harness.run_job(NEVER_STARTS.format(containers=containers.format(**images)))
    rows = "\n".join(view.log_rows)
    assert view.result == Result.FAILURE, rows
    assert [line for line in expected if line not in rows] == [], rows
    assert [s.status for s in view.steps] != ["success"]


async def test_container_actions_docker_image_and_dockerfile(
    executor_harness: ExecutorHarness, job_images: JobImages, engine: Engine
) -> None:
    workflow = (
        BUILD
        + f"""\
    steps:
      - uses: docker://{job_images.shell_only}
        with:
          entrypoint: /bin/sh
          args: -c "echo docker-uri in $(pwd) sees $GITHUB_WORKSPACE; echo out=1 >> $GITHUB_OUTPUT"
      - uses: ./dockerfile-action
        id: built
        with:
          who: tester
      - run: echo "after ${{{{ steps.built.outputs.said }}}} file=$(cat made-by-action)"
"""
    )
    files = {
        "dockerfile-action/action.yml": (
            "name: d\ninputs:\n  who: {}\noutputs:\n  said: {}\nruns:\n  using: docker\n  image: Dockerfile\n"
            "  args: ['hello ${{ inputs.who }}']\n  env:\n    EXTRA: from-runs-env\n"
        ),
        "dockerfile-action/Dockerfile": (
            f'FROM {job_images.shell_only}\nCOPY entry.sh /entry.sh\nENTRYPOINT ["/bin/sh", "/entry.sh"]\n'
        ),
        "dockerfile-action/entry.sh": (
            'echo "action got [$1] input=$INPUT_WHO extra=$EXTRA"\n'
            'echo "said=$1" >> "$GITHUB_OUTPUT"\n'
            "echo made > made-by-action\n"
        ),
    }
    view = await executor_harness.run_job(workflow, files=files)
    rows = "\n".join(view.log_rows)
    assert view.result == Result.SUCCESS, rows
    assert "docker-uri in /" in rows and "sees /" in rows
    assert "action got [hello tester] input=tester extra=from-runs-env" in rows
    assert "after hello tester file=made" in rows
    built = engine.check("images", "--format", "{{.Repository}}", "--filter", "reference=localhost/dynrunner-action/*")
    assert built.split() == []  # the job's action image went with it


async def test_a_cancel_stops_the_step_in_the_job_container_and_runs_always_steps(
    executor_harness: ExecutorHarness, job_images: JobImages
) -> None:
    workflow = (
        BUILD
        + f"""\
    container: {job_images.bash}
    steps:
      - run: echo started; sleep 300
      - if: always()
        run: echo cleanup ran in $(. /etc/os-release; echo $ID)
"""
    )
    view = await cancelled_once_logged(executor_harness, workflow, "started", within=120)
    assert view.result == Result.CANCELLED
    assert "cleanup ran in debian" in view.log_rows


async def test_steps_on_the_host_reach_a_service_through_its_published_port(
    executor_harness: ExecutorHarness, job_images: JobImages
) -> None:
    workflow = (
        BUILD
        + f"""\
    services:
      redis:
        image: {job_images.redis}
        ports: ["6379"]
        options: --health-cmd "redis-cli ping" --health-interval 2s --health-retries 10
    steps:
      - shell: bash
        run: |
          port=${{{{ job.services.redis.ports['6379'] }}}}
          exec 3<>/dev/tcp/127.0.0.1/$port; printf 'PING\\r\\n' >&3; read -r answer <&3
          echo "host port $port answered ${{answer%$'\\r'}}"
"""
    )
    view = await executor_harness.run_job(workflow)
    rows = "\n".join(view.log_rows)
    assert view.result == Result.SUCCESS, rows
    assert any(row.startswith("host port ") and row.endswith(" answered +PONG") for row in view.log_rows), rows


async def test_a_cancel_while_a_service_becomes_healthy_stops_the_job_and_removes_its_containers(
    executor_harness: ExecutorHarness, job_images: JobImages
) -> None:
    workflow = (
        BUILD
        + f"""\
    container: {job_images.bash}
    services:
      slow:
        image: {job_images.redis}
        options: --health-cmd false --health-interval 10s --health-retries 60
    steps:
      - run: echo never
"""
    )
    view = await cancelled_once_logged(executor_harness, workflow, "Waiting for service slow to be healthy", within=60)
    assert view.result == Result.CANCELLED
    assert "The job was cancelled while its containers started." in view.log_rows
    assert "never" not in view.log_rows


async def test_credentials_are_masked_and_named_volumes_are_mounted(
    executor_harness: ExecutorHarness, job_images: JobImages, engine: Engine
) -> None:
    volume = f"dynrunner-test-{secrets.token_hex(4)}"
    workflow = (
        BUILD
        + f"""\
    container:
      image: {job_images.bash}
      credentials:
        username: robot
        password: pull-password-123
      volumes:
        - {volume}:/cache
    steps:
      - run: |
          echo "the password is pull-password-123"
          echo cached > /cache/file
      - uses: docker://{job_images.shell_only}
        with:
          entrypoint: /bin/sh
          args: -c "echo the volume outlives steps"
      - run: cat /cache/file
"""
    )
    claimed = await executor_harness.claim(workflow)
    try:
        assert await executor_harness.run(claimed) == 0
        code, out, _ = await engine.call("volume", "inspect", "--format", "{{.Name}}", volume)
        assert (code, out.strip()) == (0, volume)  # a named volume is the user's: it stays
    finally:
        await engine.call("volume", "rm", "--force", volume)
    view = executor_harness.gitea.task(claimed.task_id)
    rows = "\n".join(view.log_rows)
    assert view.result == Result.SUCCESS, rows
    assert "the password is ***" in view.log_rows
    assert "pull-password-123" not in rows
    assert "cached" in view.log_rows
    root = Path(claimed.assignment.executor.workspace)
    assert not (root / ".dynrunner" / "containers" / "auth.json").exists()  # removed with the job


async def test_a_local_pool_runs_a_job_container_with_a_service_through_the_controller(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, job_images: JobImages
) -> None:
    """The whole path: the controller claims, the local backend starts the executor (passing
    it the podman settings), the executor starts the job container and the service."""
    workflow = f"""
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    container: {job_images.shell_only}
    services:
      redis:
        image: {job_images.redis}
        options: --health-cmd "redis-cli ping" --health-interval 2s --health-retries 10
    steps:
      - run: echo "in $(. /etc/os-release; echo $ID) without bash=$(command -v bash || echo yes)"
"""
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state")
    async with in_process(cfg):
        run = gitea.submit("acme/app", workflow)
        done = await wait_run_done(gitea, run.id, within=300)
        (job,) = done.jobs
        rows = gitea.task(job.task_id).log_rows
        assert done.status == "success", "\n".join(rows)
        assert "Service redis is healthy" in rows
        assert "in debian without bash=yes" in rows


async def test_a_container_image_that_evaluates_to_nothing_runs_the_job_on_the_runner(
    executor_harness: ExecutorHarness,
) -> None:
    workflow = (
        BUILD
        + """\
    container: ${{ github.event_name == 'never' && 'some/image' || '' }}
    steps:
      - run: echo "on the runner, container=${{ job.container == null }}"
"""
    )
    view = await executor_harness.run_job(workflow)
    assert view.result == Result.SUCCESS, "\n".join(view.log_rows)
    assert "on the runner, container=true" in view.log_rows


async def test_a_docker_uri_that_is_an_option_is_refused(executor_harness: ExecutorHarness) -> None:
    workflow = (
        BUILD
        + """\
    steps:
      - uses: docker://--privileged
"""
    )
    view = await executor_harness.run_job(workflow)
    assert view.result == Result.FAILURE
    assert "##[error]The action's image cannot be run: '--privileged' is not an image name." in view.log_rows


async def test_a_called_workflows_job_runs_in_its_job_container_with_its_service(
    self_hosted_actions: ExecutorHarness, job_images: JobImages
) -> None:
    called = f"""
on:
  workflow_call:
    outputs:
      where:
        value: ${{{{ jobs.inside.outputs.where }}}}
jobs:
  inside:
    runs-on: self-hosted
    container: {job_images.shell_only}
    services:
      cache:
        image: {job_images.redis}
        options: --health-cmd "redis-cli ping" --health-interval 2s --health-retries 10
    outputs:
      where: ${{{{ steps.w.outputs.where }}}}
    steps:
      - id: w
        run: |
          echo "called job in $(. /etc/os-release; echo $ID), bash=$(command -v bash || echo none)"
          echo "where=container" >> "$GITHUB_OUTPUT"
"""
    gitea = self_hosted_actions.gitea
    gitea.create_repository("owner/repo", private=True)
    gitea.commit("owner/repo", {".gitea/workflows/called.yml": called})
    caller = "on: push\njobs:\n  call:\n    uses: ./.gitea/workflows/called.yml\n"
    task = await self_hosted_actions.run_job(caller)
    rows = task.log_rows
    assert task.result == Result.SUCCESS, "\n".join(rows)
    assert "Service cache is healthy" in rows
    assert "called job in debian, bash=none" in rows
    assert task.outputs == {"where": "container"}
