"""Reusable workflows through `act` (host mode) and through our executor: the same lines
printed by every called job's steps, the same result of every called job and of the calling
jobs, the same outputs reaching a later job.

The called workflows (tests/fixtures/reusable_workflows.py, as the other tiers run them, and a
failing one of this module's own) live in the caller's repository (`./.github/workflows/x.yml`):
act reads them from its checkout, ours fetches them from the Gitea double at the run's commit. A
workflow of another repository is not compared (act would fetch it from github.com); that form
is proved against the double in tests/integration/executor/test_reusable_workflows.py and
tests/e2e/test_reusable_workflows.py.

act names a called job `<caller>/<file>/<job>` in its `--json` log; ours frames each called
job's rows with `Job <job>: …, called by <workflow>` and `Job <job> of <workflow>: <result>`,
so lines are compared per (calling job, called job). Known differences, left out: act does
not check `with:` against `on.workflow_call` (an undeclared input, a wrong type or a missing
required input or secret pass), has no nesting limit, and gives a job whose needs did not all
succeed no `if:` check of its own (it skips it as we do); ours follows GitHub there (tests in
tests/integration/executor/test_reusable_workflows.py).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from dynrunner.doubles.gitea.views import TaskView
from tests.fixtures.act import act_repo, needs_act, run_act
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.reusable_workflows import GREET, caller, levels, nested_caller, the_callers_repository

pytestmark = [pytest.mark.act, needs_act]

SECRETS = {"MY_TOKEN": "s3cr3t-value", "OTHER": "0ther-value"}
_CALLED_START = re.compile(r"^Job (\S+): .*, called by (.+)$")
_CALLED_END = re.compile(r"^Job (\S+) of (.+): (\w+)$")
_MATRIX_SUFFIX = re.compile(r"-\d+$")
_RESULTS = {1: "success", 2: "failure", 3: "cancelled", 4: "skipped"}

FAILING = """
on:
  workflow_call:
    inputs:
      fail:
        type: boolean
        default: true
jobs:
  build:
    runs-on: self-hosted
    strategy:
      matrix:
        part: [a, b]
    steps:
      - run: echo "building ${{ matrix.part }}"
      - if: inputs.fail && matrix.part == 'b'
        run: exit 1
  cleanup:
    needs: build
    if: always()
    runs-on: self-hosted
    steps:
      - run: echo "cleanup after ${{ needs.build.result }}"
  publish:
    needs: build
    runs-on: self-hosted
    steps:
      - run: echo "never printed"
"""

FAILS = """
on: push
jobs:
  call:
    uses: ./.github/workflows/failing.yml
"""

WORKFLOWS = ".github/workflows"
CASES: dict[str, tuple[str, dict[str, str]]] = {
    "inputs-secrets-outputs": (caller(f"./{WORKFLOWS}/greet.yml"), {f"{WORKFLOWS}/greet.yml": GREET}),
    "a-failing-called-job": (FAILS, {f"{WORKFLOWS}/failing.yml": FAILING}),
    # act runs no job after a nested call (docs/reusable-workflows.md)
    "nested-and-inherited": (nested_caller(WORKFLOWS, later=False), levels(2, WORKFLOWS)),
}
# a matrix's combinations run one after another here, at once in act: their lines compare unordered
MATRIX_JOBS = ("build", "count")

Lines = dict[tuple[str, str], list[str]]


def _files(workflow: str, called: Mapping[str, str]) -> dict[str, str]:
    return {f"{WORKFLOWS}/ci.yml": workflow, **called}


async def act_lines(tmp_path: Path, workflow: str, called: Mapping[str, str]) -> tuple[Lines, dict[str, str]]:
    """act's printed lines per (calling job, called job), and each job's result."""
    repo = act_repo(tmp_path, _files(workflow, called))
    secrets = [arg for key, value in SECRETS.items() for arg in ("-s", f"{key}={value}")]
    out, err = await run_act(repo, "-W", f"{WORKFLOWS}/ci.yml", *secrets, timeout_s=180)
    lines: Lines = {}
    results: dict[str, str] = {}
    for raw in out.splitlines():
        entry = json.loads(raw)
        # `<caller>/<file>/<job>` (the innermost call only), `ci.yml/<job>` for a plain job;
        # a matrix combination's job is `<job>-<n>` (no job here has such a name of its own),
        # and act pads the names of the jobs it runs beside one to that one's length
        parts = str(entry.get("job", "")).split("/")
        job = _MATRIX_SUFFIX.sub("", parts[-1].rstrip())
        key = (parts[-3], job) if len(parts) > 2 else ("", job)
        if "jobResult" in entry:
            name = "/".join(key).strip("/")
            results[name] = "failure" if "failure" in (entry["jobResult"], results.get(name)) else entry["jobResult"]
        if entry.get("raw_output"):
            lines.setdefault(key, []).extend(entry["msg"].removesuffix("\n").split("\n"))
    assert results, f"act reported no job result:\n{err[-2000:]}"
    return lines, results


def _ours(task: TaskView, caller: str, lines: Lines, results: dict[str, str]) -> None:
    """The rows of one task: a plain job's steps, or a calling job's called jobs, each framed
    by our start and end rows, keyed as act keys them: (the job that called it, the job)."""
    if task.steps:
        first = task.steps[0].log_index
        last = task.steps[-1].log_index + task.steps[-1].log_length
        lines[("", caller)] = _printed(task.log_rows[first:last])
        results[caller] = _RESULTS[task.result]
        return
    stack: list[tuple[str, list[str], bool]] = []  # (job, its rows, whether it called a workflow)
    for row in task.log_rows:
        start, end = _CALLED_START.match(row), _CALLED_END.match(row)
        if start:
            if stack:
                stack[-1] = (stack[-1][0], stack[-1][1], True)
            stack.append((start.group(1), [], False))
        elif end and stack:
            job, rows, called = stack.pop()
            if not called:  # act reports the jobs that ran steps
                parent = stack[-1][0] if stack else caller
                results[f"{parent}/{job}"] = (
                    "failure" if "failure" in (end.group(3), results.get(f"{parent}/{job}")) else end.group(3)
                )
                lines.setdefault((parent, job), []).extend(_printed(rows))
        elif stack:
            stack[-1][1].append(row)


def _printed(rows: list[str]) -> list[str]:
    """What steps printed: from the first step's header on, without the headers (the `Run …`
    groups) and our own `##[…]` rows."""
    kept, header, started = [], False, False
    for row in rows:
        if row.startswith("##[group]Run "):
            header = started = True
        elif header and row == "##[endgroup]":
            header = False
        elif started and not header and not row.startswith("##["):
            kept.append(row)
    return kept


async def run_ours(harness: ExecutorHarness, workflow: str, called: Mapping[str, str]) -> tuple[Lines, dict[str, str]]:
    gitea = the_callers_repository(harness, _files(workflow, called))
    run = gitea.submit("owner/repo", workflow, secrets=SECRETS)
    lines: Lines = {}
    results: dict[str, str] = {}
    while any(job.status in ("waiting", "blocked") for job in gitea.run(run.id).jobs):
        if not any(job.status == "waiting" for job in gitea.run(run.id).jobs):
            break
        claimed = await harness.claim_waiting(run)
        assert await harness.run(claimed) == 0
        _ours(gitea.task(claimed.task_id), claimed.assignment.job_key, lines, results)
    return lines, results


@pytest.mark.parametrize("name", sorted(CASES))
async def test_reusable_workflows_as_act_runs_them(
    name: str, self_hosted_actions: ExecutorHarness, tmp_path: Path
) -> None:
    workflow, called = CASES[name]
    (theirs, their_results), (ours, our_results) = await asyncio.gather(
        act_lines(tmp_path / "act", workflow, called), run_ours(self_hosted_actions, workflow, called)
    )
    assert our_results == their_results
    assert {k: sorted(v) for k, v in ours.items()} == {k: sorted(v) for k, v in theirs.items()}
    assert {k: v for k, v in ours.items() if k[1] not in MATRIX_JOBS} == {
        k: v for k, v in theirs.items() if k[1] not in MATRIX_JOBS
    }
