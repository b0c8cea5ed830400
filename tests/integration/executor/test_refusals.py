"""Bad input: a clear line in the job log, the task finalized in Gitea, nothing else affected."""

from __future__ import annotations

import dataclasses

import pytest

from dynrunner.doubles.gitea.views import TaskView
from dynrunner.proto.assignment import encode
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness, rows_of

SIMPLE = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - run: echo hi
"""


def errors(rows: list[str]) -> list[str]:
    return [row for row in rows if row.startswith("##[error]")]


async def run_in_a_pod(harness: ExecutorHarness, workflow: str) -> TaskView:
    """Claim `workflow` and run it as the executor of a Pod pool runs it; return its task."""
    claimed = await harness.claim(workflow)
    assert await harness.run(dataclasses.replace(claimed.assignment, backend="kubernetes")) == 0
    return harness.gitea.task(claimed.task_id)


async def test_job_if_false_reports_the_job_skipped(executor_harness: ExecutorHarness) -> None:
    workflow = """
on: push
jobs:
  only-on-tags:
    runs-on: self-hosted
    if: startsWith(github.ref, 'refs/tags/')
    steps:
      - run: echo never
      - run: echo never
"""
    task = await executor_harness.run_job(workflow)
    assert task.result == Result.SKIPPED
    assert [s.status for s in task.steps] == ["skipped", "skipped"]
    assert any("Skipping job" in row for row in task.log_rows)
    assert "never" not in "\n".join(row for row in task.log_rows if not row.startswith("Skipping"))


async def test_job_if_sees_failed_needs(executor_harness: ExecutorHarness) -> None:
    """Gitea hands over a job whose need failed when it has an `if:`; the runner decides."""
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - run: exit 1
  report:
    needs: build
    if: failure()
    runs-on: self-hosted
    steps:
      - run: echo "build was ${{ needs.build.result }}"
  deploy:
    needs: build
    if: success() || github.event_name == 'nope'
    runs-on: self-hosted
    steps:
      - run: echo never
"""
    build = await executor_harness.claim(workflow)
    assert await executor_harness.run(build) == 0
    first = await executor_harness.claim_waiting(build.run)
    second = await executor_harness.claim_waiting(build.run)
    for claimed in (first, second):
        assert await executor_harness.run(claimed) == 0
    by_job = {c.assignment.job_key: executor_harness.gitea.task(c.task_id) for c in (first, second)}
    assert by_job["report"].result == Result.SUCCESS
    assert "build was failure" in by_job["report"].log_rows
    assert by_job["deploy"].result == Result.SKIPPED


async def test_malformed_payload_fails_with_the_parse_error(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(SIMPLE)
    task = dataclasses.replace(claimed.task, workflow_payload=b"jobs:\n  build:\n    steps: [run: x\n")
    assert await executor_harness.run(claimed.assignment.replace(task=task)) == 0
    view = executor_harness.gitea.task(claimed.task_id)
    assert view.result == Result.FAILURE
    (error,) = errors(view.log_rows)
    assert error.startswith(
        "##[error]The workflow Gitea sent for this job cannot be run: the workflow is not valid YAML"
    )


async def test_a_self_referring_payload_is_reported_not_crashed_on(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(SIMPLE)
    payload = (
        b"on: push\njobs:\n  build:\n    runs-on: x\n    steps:\n      - run: echo\n        env: &e\n          X: *e\n"
    )
    task = dataclasses.replace(claimed.task, workflow_payload=payload)
    assert await executor_harness.run(claimed.assignment.replace(task=task)) == 0
    view = executor_harness.gitea.task(claimed.task_id)
    assert view.result == Result.FAILURE
    (error,) = errors(view.log_rows)
    assert "an alias refers to itself" in error


async def test_an_unexpected_error_while_parsing_is_reported(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynrunner.executor import run

    def broken(payload: bytes) -> None:
        raise KeyError("a parser bug")

    monkeypatch.setattr(run, "parse_workflow", broken)
    view = await executor_harness.run_job(SIMPLE)
    assert view.result == Result.FAILURE
    (error,) = errors(view.log_rows)
    assert "KeyError" in error and "a parser bug" in error


async def test_bad_job_key_is_refused(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(SIMPLE)
    payload = (claimed.task.workflow_payload or b"").replace(b"build:", b"build.v2:")
    task = dataclasses.replace(claimed.task, workflow_payload=payload)
    assert await executor_harness.run(claimed.assignment.replace(task=task, job_key="build.v2")) == 0
    view = executor_harness.gitea.task(claimed.task_id)
    assert view.result == Result.FAILURE
    assert errors(view.log_rows) == [
        "##[error]The job id 'build.v2' cannot be used with this runner: a job id must match "
        "[A-Za-z_][A-Za-z0-9_-]* (it names the job's workload identity). Rename the job."
    ]
    assert [s.status for s in view.steps] == ["cancelled"]


async def test_a_job_key_with_a_trailing_newline_is_refused(executor_harness: ExecutorHarness) -> None:
    """`$` in a regular expression also matches before a final newline: the key rule must not."""
    claimed = await executor_harness.claim(SIMPLE)
    payload = (claimed.task.workflow_payload or b"").replace(b"build:", b'"build\\n":')
    task = dataclasses.replace(claimed.task, workflow_payload=payload)
    assert await executor_harness.run(claimed.assignment.replace(task=task, job_key="build\n")) == 0
    view = executor_harness.gitea.task(claimed.task_id)
    assert view.result == Result.FAILURE
    assert errors(view.log_rows)[0].startswith("##[error]The job id 'build\\n' cannot be used with this runner")


async def test_unknown_assignment_version_is_reported(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(SIMPLE)
    assert await executor_harness.run(encode(claimed.assignment.replace(version=2))) == 0
    view = executor_harness.gitea.task(claimed.task_id)
    assert view.result == Result.FAILURE
    (error,) = errors(view.log_rows)
    assert "assignment version 2 is not supported by this executor" in error
    assert "echo hi" not in "\n".join(view.log_rows)


async def test_unreadable_and_sealed_assignments_exit_3(executor_harness: ExecutorHarness) -> None:
    assert await executor_harness.run(b"\xff\x00 not a protobuf") == 3
    claimed = await executor_harness.claim(SIMPLE)
    sealed = claimed.assignment.replace(runner=dataclasses.replace(claimed.assignment.runner, token=""))
    assert await executor_harness.run(sealed) == 3
    assert executor_harness.gitea.task(claimed.task_id).status == "running"  # the controller finalizes it


async def test_nothing_runs_when_gitea_refuses_the_credentials(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(SIMPLE)
    wrong = dataclasses.replace(claimed.assignment.runner, token="0" * 40)
    assert await executor_harness.run(claimed.assignment.replace(runner=wrong)) == 1
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.status == "running" and task.log_rows == []  # left for the controller to finalize


async def test_a_job_not_run_because_gitea_was_unreachable_says_so(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gitea did not answer within the start timeout: nothing runs, and once Gitea answers again
    (the close retries) the log says why the job failed without running."""
    from dynrunner.executor.reporter import Reporter
    from dynrunner.proto.gitea import Unavailable

    handshake = Reporter._handshake
    calls = []

    async def unreachable_at_first(self: Reporter, deadline: float) -> None:
        calls.append(deadline)
        if len(calls) == 1:
            raise Unavailable("no answer within 120s")
        await handshake(self, deadline)

    monkeypatch.setattr(Reporter, "_handshake", unreachable_at_first)
    view = await executor_harness.run_job(SIMPLE)
    assert view.result == Result.FAILURE
    assert errors(view.log_rows) == [
        "##[error]The job was not run: Gitea could not be reached to report it (Unavailable: no answer within 120s)."
    ]
    assert [s.status for s in view.steps] == ["cancelled"]


async def test_a_container_action_fails_its_step_saying_it_needs_a_container_runtime(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNRUNNER_PODMAN", "/nonexistent/podman")  # an environment without podman
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - uses: docker://alpine:3.20
        with:
          args: echo hi
      - if: always()
        run: echo "run steps still work"
"""
    view = await executor_harness.run_job(workflow)
    assert view.result == Result.FAILURE
    assert [s.status for s in view.steps] == ["failure", "success"]
    first = rows_of(view, 0)
    assert first[:4] == ["##[group]Run docker://alpine:3.20", "with:", "  args: echo hi", "##[endgroup]"]
    assert first[4] == (
        "##[error]The action docker://alpine:3.20 is a Docker container action, which needs a container engine, and "
        "this environment has none: container actions run in local and VM pools with podman installed "
        "(docs/containers.md), not in Pods. Use a JavaScript or composite action, or run the tool in a `run:` step."
    )


async def test_container_and_services_are_refused_clearly_without_podman(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNRUNNER_PODMAN", "/nonexistent/podman")
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    container: node:20
    services:
      db:
        image: postgres:16
    steps:
      - run: echo hi
"""
    view = await executor_harness.run_job(workflow)
    assert view.result == Result.FAILURE
    (error,) = errors(view.log_rows)
    assert error == (
        "##[error]The job sets `container:`, which needs podman in the job's environment, and this environment has "
        "none: install podman (docs/containers.md), choose an image for the pool instead, or remove it."
    )


@pytest.mark.parametrize(
    ("keys", "what"),
    [
        ("services:\n      db:\n        image: postgres:16", "declares `services:` (db)"),
        ("container: node:20", "sets `container:`"),
    ],
)
async def test_containers_a_pod_was_not_built_with_are_refused(
    executor_harness: ExecutorHarness, keys: str, what: str
) -> None:
    """An older controller's Pod: no sidecars named in DYNRUNNER_SERVICES_PROVIDED, no job
    container socket (DYNRUNNER_JOB_CONTAINER_SOCKET)."""
    workflow = f"""
on: push
jobs:
  build:
    runs-on: self-hosted
    {keys}
    steps:
      - run: echo hi
"""
    view = await run_in_a_pod(executor_harness, workflow)
    assert view.result == Result.FAILURE
    (error,) = errors(view.log_rows)
    assert error == (
        f"##[error]The job {what}, which its Pod was not built to run (by a controller older than this executor): "
        "run the job in a local or VM pool, or update the controller (docs/containers.md)."
    )


async def test_disabled_commands_and_bad_env_files_fail_the_step(executor_harness: ExecutorHarness) -> None:
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - run: echo "::set-env name=X::1"
      - if: always()
        run: echo "nameless value" >> "$GITHUB_OUTPUT"
      - if: always()
        env:
          ACTIONS_ALLOW_UNSECURE_COMMANDS: "true"
        run: |
          echo "::set-env name=X::allowed"
          echo "NODE_OPTIONS=--require /tmp/evil.js" >> "$GITHUB_ENV"
      - if: always()
        run: echo "X=$X NODE_OPTIONS=${NODE_OPTIONS:-unset}"
"""
    view = await executor_harness.run_job(workflow)
    assert [s.status for s in view.steps] == ["failure", "failure", "success", "success"]
    log = view.log_rows
    assert any("The `set-env` command is disabled" in row for row in log)
    assert any("Invalid format 'nameless value'" in row and "GITHUB_OUTPUT" in row for row in log)
    assert "##[error]Can't store NODE_OPTIONS output parameter using '$GITHUB_ENV' command." in log
    assert "X=allowed NODE_OPTIONS=unset" in log


async def test_services_the_pod_provides_are_not_refused(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a Pod whose controller made the services sidecars (DYNRUNNER_SERVICES_PROVIDED), the
    executor starts none, gives `job.services` the ports, and masks the credentials."""
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    services:
      db:
        image: registry.example.com/postgres:16
        ports: ['5432']
        credentials: {username: bot, password: pull-password-1}
    steps:
      - run: echo "port ${{ job.services.db.ports['5432'] }} with pull-password-1"
"""
    monkeypatch.setenv("DYNRUNNER_SERVICES_PROVIDED", "db")
    view = await run_in_a_pod(executor_harness, workflow)
    assert view.result == Result.SUCCESS, view.log_rows
    assert any(row.endswith("port 5432 with ***") for row in view.log_rows), view.log_rows
    assert not any("pull-password-1" in row for row in view.log_rows)


async def test_services_the_pod_does_not_provide_are_still_refused(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    services:
      db:
        image: postgres:16
      cache:
        image: redis:7
    steps:
      - run: echo hi
"""
    monkeypatch.setenv("DYNRUNNER_SERVICES_PROVIDED", "db")
    (error,) = errors((await run_in_a_pod(executor_harness, workflow)).log_rows)
    assert "which its Pod was not built to run" in error
