"""Workflow commands as the job log shows them, and the contexts a step can read."""

from __future__ import annotations

import json

from dynrunner.executor.workflow import parse_workflow
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.task_rows import output_rows

COMMANDS = """
on: push
jobs:
  commands:
    runs-on: self-hosted
    outputs:
      legacy: ${{ steps.legacy.outputs.value }}
    steps:
      - run: |
          echo "::group::Compile"
          echo "inside the group"
          echo "::endgroup::"
          echo "::error file=src/main.c,line=3,col=7,title=cc::expected ';'"
          echo "::warning::careful%0Atwo lines"
          echo "::notice::fyi"
          echo "::debug::only with step debug"
          echo "::stop-commands::a-long-token"
          echo "::error::printed verbatim"
          echo "::a-long-token::"
          echo "::error::an error again"
      - id: legacy
        run: echo "::set-output name=value::from set-output"
      - run: |
          echo "## Summary" >> "$GITHUB_STEP_SUMMARY"
          echo "- all good" >> "$GITHUB_STEP_SUMMARY"
"""


async def test_commands_render_for_gitea(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(COMMANDS)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS  # annotations do not fail a step
    assert output_rows(task, 0) == [
        "::group::Compile",
        "inside the group",
        "::endgroup::",
        "##[error]src/main.c:3:7: cc: expected ';'",
        "##[warning]careful",
        "##[warning]two lines",
        "##[notice]fyi",
        "::error::printed verbatim",
        "##[error]an error again",
    ]
    assert output_rows(task, 1)[0].startswith("##[warning]The `set-output` command is deprecated")
    assert task.outputs == {"legacy": "from set-output"}
    assert output_rows(task, 2) == ["##[group]Step summary", "## Summary", "- all good", "##[endgroup]"]


async def test_debug_rows_with_actions_step_debug(executor_harness: ExecutorHarness) -> None:
    workflow = """
on: push
jobs:
  debug:
    runs-on: self-hosted
    steps:
      - run: |
          echo "::debug::now visible"
          echo "runner.debug=${{ runner.debug }} RUNNER_DEBUG=$RUNNER_DEBUG"
"""
    claimed = await executor_harness.claim(workflow, secrets={"ACTIONS_STEP_DEBUG": "true"})
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert output_rows(task, 0) == ["##[debug]now visible", "runner.debug=1 RUNNER_DEBUG=1"]


CONTEXTS = """
on: push
jobs:
  matrix:
    runs-on: self-hosted
    strategy:
      matrix:
        os: [linux]
        version: [3, 4]
    steps:
      - env:
          FROM_VARS: ${{ vars.GREETING }}
        run: |
          echo "matrix ${{ matrix.os }}-${{ matrix.version }} index ${{ strategy.job-index }}/${{ strategy.job-total }}"
          echo "vars $FROM_VARS ${{ vars.GREETING }}"
          echo "gitea is github: ${{ gitea.repository == github.repository }}"
          echo 'json ${{ toJSON(matrix) }}' | tr -d ' \\n'; echo
      - if: ${{ secrets.NOPE != '' }}
        run: echo never
"""


async def test_matrix_strategy_vars_and_context_availability(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(CONTEXTS, vars={"GREETING": "hi"})
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    strategy = parse_workflow(claimed.task.workflow_payload or b"").job.strategy
    assert strategy is not None
    version = strategy.matrix["version"]
    assert output_rows(task, 0) == [
        f"matrix linux-{version} index {strategy.job_index}/{strategy.job_total}",
        "vars hi hi",
        "gitea is github: true",
        f"json{json.dumps({'os': 'linux', 'version': version}, separators=(',', ':'))}",
    ]
    # `secrets` is not available in a step's `if:` (GitHub's table): the step fails with the reason
    assert [s.status for s in task.steps] == ["success", "failure"]
    step = task.steps[1]
    (error,) = task.log_rows[step.log_index : step.log_index + step.log_length]
    assert error.startswith("##[error]The step's `if:` could not be evaluated:") and "secrets" in error


async def test_workflow_dispatch_inputs(executor_harness: ExecutorHarness) -> None:
    workflow = """
on:
  workflow_dispatch:
    inputs:
      dry-run:
        type: boolean
      count:
        type: number
        default: 2
jobs:
  dispatch:
    runs-on: self-hosted
    steps:
      - run: echo "dry=${{ inputs.dry-run }} negated=${{ !inputs.dry-run }} count+=${{ inputs.count }}"
"""
    event = {"inputs": {"dry-run": "true", "count": "5"}}
    claimed = await executor_harness.claim(workflow, event_name="workflow_dispatch", event=event)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert output_rows(task, 0) == ["dry=true negated=false count+=5"]


NO_CONTAINER = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - run: echo "container=[${{ job.container }}] ${{ job.container && 'truthy' || 'falsy' }} ${{ job.status }}"
"""


async def test_a_job_without_a_container_has_an_empty_job_container(executor_harness: ExecutorHarness) -> None:
    """GitHub's and act's `job.container` is empty there; actions that test it pick their shell by it."""
    claimed = await executor_harness.claim(NO_CONTAINER)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert output_rows(task, 0) == ["container=[] falsy success"]
