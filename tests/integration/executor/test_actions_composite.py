"""Composite actions from the workspace: nested actions, inputs and outputs, a failing inner step,
the action's own status, `continue-on-error`, `$GITHUB_ENV` across levels, the depth limit."""

from __future__ import annotations

import asyncio

from dynrunner.doubles.gitea.views import TaskView
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness, github_workspace, rows_of


def printed(task: TaskView, index: int) -> list[str]:
    """What the step's processes printed: no group headers or their contents, no `##[` rows."""
    rows, inside = [], False
    for row in rows_of(task, index):
        if row.startswith("##[group]"):
            inside = True
        elif row == "##[endgroup]":
            inside = False
        elif not inside and not row.startswith("##["):
            rows.append(row)
    return rows


INNER = """
name: inner
inputs:
  who:
    required: true
  greeting:
    default: hello
outputs:
  said:
    value: ${{ steps.say.outputs.text }}
runs:
  using: composite
  steps:
    - id: say
      shell: bash
      run: |
        echo "text=${{ inputs.greeting }} ${{ inputs.who }}" >> "$GITHUB_OUTPUT"
        echo "INNER_WAS_HERE=yes" >> "$GITHUB_ENV"
"""

OUTER = """
name: outer
inputs:
  name:
    description: whom to greet
  fail:
    default: 'false'
outputs:
  result:
    value: ${{ steps.inner.outputs.said }}
runs:
  using: composite
  steps:
    - id: inner
      uses: ./.github/actions/inner
      with:
        who: ${{ inputs.name }}
    - shell: bash
      env:
        INNER_STEP: set
      run: |
        echo "inner said ${{ steps.inner.outputs.said }}; env level=$LEVEL outer=$OUTER inner_step=$INNER_STEP"
        echo "from GITHUB_ENV: $INNER_WAS_HERE; action path ends with $(basename "$GITHUB_ACTION_PATH")"
        echo "inputs are no variables here: '${INPUT_NAME-}'"
    - id: bad
      if: inputs.fail == 'true'
      shell: bash
      run: echo "failing on purpose"; exit 3
    - if: failure()
      shell: bash
      run: echo "failure() sees the action's failed step; job status ${{ job.status }}"
    - shell: bash
      run: echo "only while the action succeeds"
    - if: always()
      shell: sh
      working-directory: .github
      run: echo "always() in $(basename "$PWD"), bad outcome=${{ steps.bad.outcome }}"
"""

ACTIONS = {".github/actions/inner/action.yml": INNER, ".github/actions/outer/action.yaml": OUTER}

NESTED = """
on: push
jobs:
  build:
    runs-on: self-hosted
    env:
      LEVEL: job
    steps:
      - id: ok
        uses: ./.github/actions/outer
        env:
          OUTER: o1
        with:
          name: world
      - id: fails
        uses: ./.github/actions/outer
        continue-on-error: true
        with:
          name: again
          fail: 'true'
      - run: |
          echo "ok=${{ steps.ok.outputs.result }} outcome=${{ steps.ok.outcome }}"
          echo "fails=${{ steps.fails.outputs.result }} ${{ steps.fails.outcome }}/${{ steps.fails.conclusion }}"
          echo "GITHUB_ENV from a nested step: $INNER_WAS_HERE; no inner steps here: ${{ toJSON(steps.inner) }}"
"""


async def test_nested_composite_actions_with_outputs_and_a_failing_inner_step(
    executor_harness: ExecutorHarness,
) -> None:
    task = await executor_harness.run_job(NESTED, files=ACTIONS)
    assert task.result == Result.SUCCESS  # the failing action had continue-on-error
    assert [s.status for s in task.steps] == ["success", "failure", "success"]
    assert printed(task, 0) == [
        "inner said hello world; env level=job outer=o1 inner_step=set",
        "from GITHUB_ENV: yes; action path ends with outer",
        "inputs are no variables here: ''",
        "only while the action succeeds",
        "always() in .github, bad outcome=skipped",
    ]
    assert printed(task, 1) == [
        "inner said hello again; env level=job outer= inner_step=set",
        "from GITHUB_ENV: yes; action path ends with outer",
        "inputs are no variables here: ''",
        "failing on purpose",
        "failure() sees the action's failed step; job status success",
        "always() in .github, bad outcome=failure",
        "Failed but continue next step (continue-on-error)",
    ]
    assert "##[error]Process completed with exit code 3." in rows_of(task, 1)
    assert printed(task, 2) == [
        "ok=hello world outcome=success",
        "fails=hello again failure/success",
        "GITHUB_ENV from a nested step: yes; no inner steps here: null",
    ]
    headers = [row for row in rows_of(task, 0) if row.startswith("##[group]")]
    assert headers[:3] == [
        "##[group]Run ./.github/actions/outer",
        "##[group]Run ./.github/actions/inner",
        '##[group]Run echo "text=hello world" >> "$GITHUB_OUTPUT"',
    ]


GREET = """
inputs:
  who:
    required: true
  how:
    required: true
    default: hi
runs:
  using: composite
  steps:
    - shell: bash
      run: echo "${{ inputs.how }} ${{ inputs.who }}"
"""

MISSING_INPUT = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: missing
        uses: ./greet
        with:
          extra: 1
      - if: always()
        uses: ./greet
        with:
          WHO: case-insensitive
          surplus: x
"""


async def test_a_required_input_that_is_missing_is_empty_with_a_warning_as_on_github(
    executor_harness: ExecutorHarness,
) -> None:
    """GitHub's runner (and act) run the action with the input empty (actions/runner#1070)."""
    task = await executor_harness.run_job(MISSING_INPUT, files={"greet/action.yml": GREET})
    assert task.result == Result.SUCCESS
    assert [s.status for s in task.steps] == ["success", "success"]
    assert (
        "##[warning]Input required and not supplied: 'who'. The action './greet' declares it required and runs "
        "with it empty, as on GitHub; give it under `with:` if the action needs it."
    ) in rows_of(task, 0)
    assert printed(task, 0) == ["hi "]
    assert printed(task, 1) == ["hi case-insensitive"]
    assert "##[warning]Unexpected input(s) 'surplus', valid inputs are ['who', 'how']" in rows_of(task, 1)


DEEP = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - uses: ./loop
"""


async def test_composite_actions_nest_at_most_ten_deep(executor_harness: ExecutorHarness) -> None:
    loop = "runs:\n  using: composite\n  steps:\n    - uses: ./loop\n"
    task = await executor_harness.run_job(DEEP, files={"loop/action.yml": loop})
    assert task.result == Result.FAILURE
    assert [s.status for s in task.steps] == ["failure"]
    errors = [row for row in rows_of(task, 0) if row.startswith("##[error]")]
    assert errors == [
        "##[error]The action ./loop would nest composite actions more than 10 levels deep, the most a runner allows."
    ]
    assert sum(row == "##[group]Run ./loop" for row in rows_of(task, 0)) == 11


async def test_a_local_action_missing_from_the_workspace_fails_its_step_as_on_github(
    executor_harness: ExecutorHarness,
) -> None:
    workflow = "on: push\njobs:\n  b:\n    runs-on: self-hosted\n    steps:\n      - uses: ./tools/lint\n"
    claimed = await executor_harness.claim(workflow)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    workspace = github_workspace(claimed.assignment)
    assert task.result == Result.FAILURE
    assert rows_of(task, 0) == [
        f"##[error]Can't find 'action.yml', 'action.yaml' or 'Dockerfile' under '{workspace / 'tools' / 'lint'}'. "
        "Did you forget to run actions/checkout before running your local action?"
    ]


SLOW = """
runs:
  using: composite
  steps:
    - shell: bash
      run: echo "nested started"; sleep 600
    - shell: bash
      run: echo "never, the job was cancelled"
    - if: always()
      shell: bash
      run: echo "always() inside after the cancel, job ${{ job.status }}"
"""


async def test_a_cancelled_step_inside_a_composite_action_cancels_the_action(
    executor_harness: ExecutorHarness,
) -> None:
    """The calling step keeps running (`if: always()`); its nested step's own `if:` no longer
    holds and it is stopped, the action's `always()` step still runs, the action ends cancelled."""
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - if: always()
        uses: ./slow
      - run: echo "not after the cancel"
"""
    claimed = await executor_harness.claim(workflow, files={"slow/action.yml": SLOW})
    running = asyncio.create_task(executor_harness.run(claimed))
    await executor_harness.wait_for_log(claimed.task_id, "nested started")
    executor_harness.gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert [s.status for s in task.steps] == ["cancelled", "skipped"]
    assert printed(task, 0) == ["nested started", "always() inside after the cancel, job cancelled"]


BOMBS = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - uses: ./laughs
        continue-on-error: true
      - uses: ./deep
        continue-on-error: true
      - uses: ./huge
        continue-on-error: true
      - run: echo "the job goes on"
"""


def _alias_bomb(levels: int = 12) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, levels):
        lines.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]")
    return "\n".join(lines) + f"\nruns:\n  using: composite\n  steps: *a{levels - 1}\n"


async def test_an_action_yml_bomb_fails_its_step_clearly_and_the_job_goes_on(executor_harness: ExecutorHarness) -> None:
    """An action's metadata that expands without bound through aliases, nests 100,000 deep or
    is larger than 4 MiB: each fails its own step with the reason, in bounded time and memory."""
    files = {
        "laughs/action.yml": _alias_bomb(),
        "deep/action.yml": "runs: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "huge/action.yml": "name: x\n" + "# " + "x" * (5 * 1024 * 1024) + "\nruns:\n  using: composite\n  steps: []\n",
    }
    task = await asyncio.wait_for(executor_harness.run_job(BOMBS, files=files), 120)
    assert task.result == Result.SUCCESS
    assert [s.status for s in task.steps] == ["failure", "failure", "failure", "success"]
    errors = [[row for row in rows_of(task, i) if row.startswith("##[error]")] for i in range(3)]
    assert "expands to more than" in errors[0][0], errors
    assert "is not valid YAML" in errors[1][0], errors  # the parser's own bound on nesting
    assert "larger than 4194304 bytes" in errors[2][0], errors
    assert printed(task, 3) == ["the job goes on"]
