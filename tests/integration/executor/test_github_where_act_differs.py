"""GitHub's behaviour where `act` (and so Gitea's act_runner) behaves otherwise: the cases the
differential tests (`tests/differential/test_act_parity.py`) leave out, each proved here
against the Gitea double instead. Each test says what GitHub documents and what act does."""

from __future__ import annotations

from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.task_rows import output_rows, step_rows

ACTION_NAMES = """
on: push
jobs:
  names:
    runs-on: self-hosted
    steps:
      - run: echo "GITHUB_ACTION=$GITHUB_ACTION github.action=${{ github.action }}"
      - id: given
        run: echo "GITHUB_ACTION=$GITHUB_ACTION github.action=${{ github.action }}"
      - name: named but no id
        run: echo "GITHUB_ACTION=$GITHUB_ACTION github.action=${{ github.action }}"
"""


async def test_a_step_without_an_id_is_named_run_then_run_2(executor_harness: ExecutorHarness) -> None:
    """GitHub's docs (`github.action`): a script step without an id is `__run`, the second
    `__run_2`; a step with an id is named by it. act uses the step's index (`0`, `2`)."""
    claimed = await executor_harness.claim(ACTION_NAMES)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert [output_rows(task, i) for i in range(3)] == [
        ["GITHUB_ACTION=__run github.action=__run"],
        ["GITHUB_ACTION=given github.action=given"],
        ["GITHUB_ACTION=__run_2 github.action=__run_2"],
    ]


EVALUATION_ERRORS = """
on: push
jobs:
  errors:
    runs-on: self-hosted
    steps:
      - id: bad-run
        continue-on-error: true
        run: echo "${{ format('{0', 1) }}"
      - id: bad-timeout
        timeout-minutes: ${{ fromJSON('not a number') }}
        run: echo "runs without a timeout"
      - id: report
        run: echo "${{ steps.bad-run.outcome }}/${{ steps.bad-run.conclusion }} ${{ steps.bad-timeout.outcome }}"
      - id: bad-if
        continue-on-error: true
        if: fromJSON('{')
        run: echo "never"
      - id: skipped
        run: echo "never"
      - id: bad-env
        if: always()
        continue-on-error: true
        env:
          X: ${{ fromJSON('[') }}
        run: echo "never"
      - id: last
        if: always()
        run: |
          echo "if: ${{ steps.bad-if.outcome }}/${{ steps.bad-if.conclusion }}"
          echo "env: ${{ steps.bad-env.outcome }}/${{ steps.bad-env.conclusion }} job: ${{ job.status }}"
"""


async def test_expression_errors_fail_the_step_as_githubs_runner_does(executor_harness: ExecutorHarness) -> None:
    """GitHub's runner (`StepsRunner`): an error in `run:` fails the started step, and
    `continue-on-error` makes its conclusion a success; an error in the step's `env:` or `if:`
    fails it before it starts, without consulting `continue-on-error`, so the job fails; a
    `timeout-minutes` it cannot evaluate is reported and the step runs without a timeout.
    act runs a step whose `run:` fails to evaluate as an empty script (success) and reports
    a step whose `if:` fails as skipped."""
    claimed = await executor_harness.claim(EVALUATION_ERRORS)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert [s.status for s in task.steps] == [
        "failure",
        "success",
        "success",
        "failure",
        "skipped",
        "failure",
        "success",
    ]
    assert task.result == Result.FAILURE
    rows = step_rows(task, 1)
    assert rows[0] == "##[error]An error occurred when attempting to determine the step timeout."
    assert rows[1].startswith("##[error]Error parsing null value.")
    assert output_rows(task, 1) == ["runs without a timeout"]
    assert output_rows(task, 2) == ["failure/success success"]
    assert output_rows(task, 6) == ["if: failure/failure", "env: failure/failure job: failure"]


CONTEXTS = """
on: push
env:
  FROM_WORKFLOW: w
jobs:
  contexts:
    runs-on: self-hosted
    steps:
      - id: first
        env:
          FROM_STEP: s
        run: |
          echo "env=${{ toJSON(env) }}"
          echo "steps=${{ toJSON(steps) }}"
          echo "runner.environment=${{ runner.environment }}"
          echo "strategy=${{ strategy.job-index }}/${{ strategy.job-total }}"
          echo 'object=${{ toJSON(fromJSON('{"b": 1, "a": {"z": 1, "y": 2}}')) }}'
      - run: echo "no id"
      - id: last
        run: echo 'steps=${{ toJSON(steps) }}'
"""


async def test_contexts_hold_what_github_documents(executor_harness: ExecutorHarness) -> None:
    """GitHub's docs: the `env` context holds the workflow's, job's and step's `env:` (and
    GITHUB_ENV's additions), not the variables the runner sets (act adds `GITHUB_WORKSPACE` and
    the rest); `steps` holds the steps with an id that have finished (act adds the running step
    and steps without an id, by index); `runner.environment` is `self-hosted` and a job without
    a matrix has `strategy.job-index` 0 of `job-total` 1 (act leaves them empty). Objects keep
    their keys in order — the runner's dictionaries keep insertion order, `outputs`, `outcome`,
    `conclusion` for a step — where act's Go maps sort them."""
    claimed = await executor_harness.claim(CONTEXTS)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert output_rows(task, 0) == [
        "env={",
        "  FROM_WORKFLOW: w,",
        "  FROM_STEP: s",
        "}",
        "steps={}",
        "runner.environment=self-hosted",
        "strategy=0/1",
        "object={",
        '  "b": 1,',
        '  "a": {',
        '    "z": 1,',
        '    "y": 2',
        "  }",
        "}",
    ]
    assert output_rows(task, 2) == [
        "steps={",
        '  "first": {',
        '    "outputs": {},',
        '    "outcome": "success",',
        '    "conclusion": "success"',
        "  }",
        "}",
    ]


FIXED_VARIABLES = """
on: push
env:
  GITHUB_EVENT_NAME: from-workflow
jobs:
  fixed:
    runs-on: self-hosted
    steps:
      - id: write
        env:
          GITHUB_JOB: from-step
          RUNNER_OS: from-step
          CI: from-step
        run: |
          echo "job=$GITHUB_JOB os=$RUNNER_OS ci=$CI event=$GITHUB_EVENT_NAME ctx=${{ env.GITHUB_JOB }}"
          echo "GITHUB_REF=from-file" >> "$GITHUB_ENV"
          echo "RUNNER_ARCH=from-file" >> "$GITHUB_ENV"
          echo "CI=from-file" >> "$GITHUB_ENV"
      - id: read
        run: echo "ref=$GITHUB_REF arch=$RUNNER_ARCH ci=$CI ctx=${{ env.GITHUB_REF }} ${{ env.RUNNER_ARCH }}"
"""


async def test_github_and_runner_variables_cannot_be_overwritten(executor_harness: ExecutorHarness) -> None:
    """GitHub's docs (variables): "You can't overwrite the value of the default environment
    variables named GITHUB_* and RUNNER_*. Currently you can overwrite the value of the CI
    variable." Its runner sets them from its contexts after the `env:` layers. The `env`
    context still shows what the workflow set. act lets a step's `env:` (and `$GITHUB_ENV`,
    for RUNNER_*) overwrite them."""
    claimed = await executor_harness.claim(FIXED_VARIABLES)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    arch = output_rows(task, 1)[0].split()[1]
    assert output_rows(task, 0) == ["job=fixed os=Linux ci=from-step event=push ctx=from-step"]
    assert output_rows(task, 1) == [f"ref=refs/heads/main {arch} ci=from-file ctx=from-file from-file"]
    assert arch in ("arch=X64", "arch=ARM64", "arch=X86", "arch=ARM")


JOB_DEFAULTS = """
on: push
jobs:
  defaults:
    runs-on: self-hosted
    env:
      DIR: a
    defaults:
      run:
        working-directory: ${{ env.DIR }}
    steps:
      - working-directory: .
        run: |
          mkdir -p a b
          echo "DIR=b" >> "$GITHUB_ENV"
      - run: echo "in $(basename "$PWD") DIR=$DIR"
      - env:
          DIR: b
        run: echo "in $(basename "$PWD") DIR=$DIR"
"""


async def test_job_defaults_are_evaluated_once_as_the_job_starts(executor_harness: ExecutorHarness) -> None:
    """GitHub's runner evaluates `jobs.<id>.defaults.run` once, when it sets up the job, with
    the workflow's and job's `env`; act evaluates it for every step, with what `$GITHUB_ENV`
    and the step's `env:` have set since."""
    claimed = await executor_harness.claim(JOB_DEFAULTS)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert [s.status for s in task.steps] == ["success", "success", "success"]
    assert output_rows(task, 1) == ["in a DIR=b"]
    assert output_rows(task, 2) == ["in a DIR=b"]
