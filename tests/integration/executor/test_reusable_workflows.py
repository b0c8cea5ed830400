"""Reusable workflows (`jobs.<id>.uses`) run by the executor inside the calling job's task,
against the Gitea double: the called workflow is fetched from the double's git server with the
task token (the caller's own repository at the run's commit, or another repository at a ref),
inputs are typed, secrets mapped and masked, outputs reach the task, nested calls work to the
depth GitHub allows, and a bad call fails the job with a line saying why."""

from __future__ import annotations

import asyncio

import pytest

from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.reusable_workflows import GREET, caller, levels, nested_caller, the_callers_repository


async def test_a_local_reusable_workflow_runs_in_the_callers_task(self_hosted_actions: ExecutorHarness) -> None:
    the_callers_repository(self_hosted_actions, {".gitea/workflows/called.yml": GREET})
    task = await self_hosted_actions.run_job(caller("./.gitea/workflows/called.yml"), secrets={"MY_TOKEN": "t0ps3cret"})
    rows = task.log_rows
    assert task.result == Result.SUCCESS, rows
    assert task.steps == []
    assert "hello world x3 loud=true note=none" in rows and "loud is a true value, three=true" in rows
    assert "secret is ***, other is ''" in rows and not any("t0ps3cret" in row for row in rows)
    assert "event push, job greet" in rows
    assert "inner needs hi world result success" in rows
    assert "matrix 1 after hi world" in rows and "matrix 2 after hi world" in rows
    assert task.outputs == {"greeting": "hi world", "both": "hi world/yes", "count": "2"}


async def test_a_remote_reusable_workflow_is_fetched_at_its_ref(self_hosted_actions: ExecutorHarness) -> None:
    gitea = self_hosted_actions.gitea
    gitea.create_repository("shared/ci")  # public: a task token reads its own repository and public ones
    gitea.commit("shared/ci", {".github/workflows/greet.yml": GREET}, tags=["v1"])
    gitea.commit("shared/ci", {".github/workflows/greet.yml": GREET.replace("hello", "changed")})
    task = await self_hosted_actions.run_job(
        caller("shared/ci/.github/workflows/greet.yml@v1"), secrets={"MY_TOKEN": "t0ps3cret"}
    )
    assert task.result == Result.SUCCESS, "\n".join(task.log_rows)
    assert "hello world x3 loud=true note=none" in task.log_rows
    assert task.outputs["greeting"] == "hi world"


async def test_nested_calls_up_to_ten_levels_and_outputs_for_a_later_job(
    self_hosted_actions: ExecutorHarness,
) -> None:
    gitea = the_callers_repository(self_hosted_actions, levels(9))  # the caller + 9 levels of reusable workflows
    claimed = await self_hosted_actions.claim(nested_caller(), secrets={"MY_TOKEN": "inh3rited"})
    assert await self_hosted_actions.run(claimed) == 0
    task = gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS, "\n".join(task.log_rows)
    assert "leaf at 1/2/3/4/5/6/7/8/9, inherited ***" in task.log_rows
    assert task.outputs == {"deepest": "1/2/3/4/5/6/7/8/9"}
    later = await self_hosted_actions.claim_waiting(claimed.run)
    assert await self_hosted_actions.run(later) == 0
    assert "deepest 1/2/3/4/5/6/7/8/9" in gitea.task(later.task_id).log_rows


BAD = {
    "missing file": ("./.gitea/workflows/absent.yml", "owner/repo has no file .gitea/workflows/absent.yml"),
    "unknown input": ("./.gitea/workflows/called.yml", "declares no input 'colour'"),
    "wrong type": ("./.gitea/workflows/called.yml", "input 'times' is a number, but the caller passed the string"),
    "missing secret": ("./.gitea/workflows/called.yml", "requires the secret 'TOKEN'"),
    "not callable": ("./.gitea/workflows/plain.yml", "its `on:` does not list `workflow_call`"),
    "bad path": ("./ci/called.yml", "must be a .yml or .yaml file directly in .gitea/workflows or .github"),
    "too deep": ("./.gitea/workflows/level1.yml", "would connect 11 levels of workflows; at most 10"),
    "cycle": ("./.gitea/workflows/loop.yml", "calls a workflow that is already being called"),
}


def _bad_caller(case: str, uses: str) -> str:
    withs = {
        "unknown input": "      who: x\n      colour: red\n",
        "wrong type": "      who: x\n      times: '3'\n",
        "missing secret": "      who: x\n",
    }.get(case, "      path: '1'\n" if case == "too deep" else "      who: x\n")
    secrets = "" if case in ("missing secret", "too deep", "cycle") else "    secrets:\n      token: abc\n"
    if case in ("too deep", "cycle"):
        secrets = "    secrets: inherit\n"
    if case == "cycle":
        withs = ""
    return f"on: push\njobs:\n  call:\n    uses: {uses}\n" + (f"    with:\n{withs}" if withs else "") + secrets


LOOP = """
on: workflow_call
jobs:
  again:
    uses: ./.gitea/workflows/loop.yml
"""


@pytest.mark.parametrize("case", sorted(BAD))
async def test_a_bad_call_fails_the_job_saying_why(self_hosted_actions: ExecutorHarness, case: str) -> None:
    files = {
        ".gitea/workflows/called.yml": GREET,
        ".gitea/workflows/plain.yml": "on: push\njobs:\n  a:\n    runs-on: x\n    steps:\n      - run: echo\n",
        ".gitea/workflows/loop.yml": LOOP,
        "ci/called.yml": GREET,
        **levels(10),
    }
    the_callers_repository(self_hosted_actions, files)
    uses, expected = BAD[case]
    task = await self_hosted_actions.run_job(_bad_caller(case, uses))
    assert task.result == Result.FAILURE
    errors = [row for row in task.log_rows if row.startswith("##[error]")]
    assert any(expected in row for row in errors), task.log_rows


SLOW = """
on: workflow_call
jobs:
  first:
    runs-on: self-hosted
    steps:
      - run: |
          echo "first started"
          sleep 600
      - if: always()
        run: echo "always ran in the called job"
  second:
    needs: first
    if: always()
    runs-on: self-hosted
    steps:
      - run: echo "second never starts after a cancel"
"""


async def test_a_cancel_stops_the_called_job_and_starts_no_other(self_hosted_actions: ExecutorHarness) -> None:
    gitea = the_callers_repository(self_hosted_actions, {".gitea/workflows/slow.yml": SLOW})
    claimed = await self_hosted_actions.claim("on: push\njobs:\n  call:\n    uses: ./.gitea/workflows/slow.yml\n")
    running = asyncio.create_task(self_hosted_actions.run(claimed))
    await self_hosted_actions.wait_for_log(claimed.task_id, "first started")
    gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    task = gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert "always ran in the called job" in task.log_rows
    assert "Job first of ./.gitea/workflows/slow.yml: cancelled" in task.log_rows
    assert not any("second" in row for row in task.log_rows)


async def test_nested_calls_fetch_each_repository_once(self_hosted_actions: ExecutorHarness) -> None:
    the_callers_repository(self_hosted_actions, levels(3))
    task = await self_hosted_actions.run_job(nested_caller(later=False), secrets={"MY_TOKEN": "x"})
    assert task.result == Result.SUCCESS, "\n".join(task.log_rows)
    assert sum(row.startswith("Download action repository 'owner/repo@") for row in task.log_rows) == 1


TOLERANT = """
on: workflow_call
jobs:
  flaky:
    runs-on: self-hosted
    continue-on-error: ${{ matrix.soft }}
    strategy:
      matrix:
        soft: [true]
    steps:
      - run: exit 1
  next:
    needs: flaky
    runs-on: self-hosted
    steps:
      - run: echo "ran after flaky, which was ${{ needs.flaky.result }}"
"""


async def test_a_called_job_under_continue_on_error_lets_the_others_run(self_hosted_actions: ExecutorHarness) -> None:
    the_callers_repository(self_hosted_actions, {".gitea/workflows/tolerant.yml": TOLERANT})
    task = await self_hosted_actions.run_job("on: push\njobs:\n  call:\n    uses: ./.gitea/workflows/tolerant.yml\n")
    assert task.result == Result.SUCCESS, "\n".join(task.log_rows)
    assert "ran after flaky, which was failure" in task.log_rows
