"""GitHub's behaviour where `act` (and so Gitea's act_runner) behaves otherwise: the cases the
differential tests (`tests/differential/test_act_parity.py`) leave out, each proved here
against the Gitea double instead. Each test says what GitHub documents and what act does."""

from __future__ import annotations

from tests.fixtures.executor import ExecutorHarness
from tests.integration.executor.test_steps_and_outputs import output_rows

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
