"""The same workflows through `act` (host mode) and through our executor: same step outcomes,
same step outputs, same job result, same lines printed by each step and by the actions'
post stages.

Most workflows are `run:`-only; `ACTION_WORKFLOWS` use composite and JavaScript actions from
the workspace (nested composite actions, inputs with defaults, outputs, `$GITHUB_ENV` and
`$GITHUB_PATH` from nested steps, the action's own `failure()`, `continue-on-error` inside
and outside, Node actions with `pre` (a local action's is not run, on either side), `post`,
`post-if`, state, failures). act reports a composite action's steps under the calling step
(`stepID` [caller, nested]) and post stages with stage `Post`; Gitea shows post stages under
"Complete job", where ours are read.

act runs in a throwaway git repository with HOME pointed at a temp dir; its `--json` log
gives each step's result (`stepResult`, the outcome), each output it recorded (`set-output`
entries) and each output line (`raw_output`). Our side is read back from the Gitea double:
step states, the job outputs (every workflow here maps `<step>__<name>` to that step output,
so both sides compare the step outputs a job declares, as Gitea keeps them: non-empty), and
the log rows of each step without the header and the runner's own `##[...]` rows. Workflows
print no paths, since the two workspaces differ. Many steps also check their values against
GitHub's documented ones (`check VALUE EXPECTED`), so a behaviour act and we share but GitHub
does not would fail a step as well.

Known differences left out here, where act deviates from GitHub and we follow GitHub (each
proved in `tests/integration/executor/test_github_where_act_differs.py` or the unit tests):

- act 0.2.89 drops the output lines between `::stop-commands::` and its token; GitHub and
  Gitea's runner print them, as we do (integration tests).
- act keeps the CR of a CRLF line end, or a lone CR (a progress bar), in the row and lets a
  line without `=` or `<<` in $GITHUB_ENV pass; GitHub's runner splits rows on CRLF and CR
  and fails the step, as we do (unit tests).
- act masks a multi-line `::add-mask::` value (`%0A`) only as a whole, which never matches a
  row; GitHub's runner also masks each line of it, as we do (unit tests).
- Environment files: act fails the job at a blank line in $GITHUB_OUTPUT or $GITHUB_ENV (and
  drops the step's outputs) and lets an unterminated heredoc or an empty name pass; GitHub
  skips blank lines and fails the step for the other two (tests/unit/runtime/test_envfile.py).
- `timeout-minutes`: act ignores a fractional value and GitHub truncates it to whole
  minutes; we honour it (`0.5` is 30 s), deliberately (docs/executor.md), so fractional
  timeouts are proved in tests/integration/executor/test_cancel_and_timeouts.py instead.
- `GITHUB_ACTION`/`github.action` of a step without an id: act uses the step's index; GitHub
  names it `__run`, `__run_2`, ...
- A step's `env:` overwrites `GITHUB_*`/`RUNNER_*` variables in act (and `$GITHUB_ENV` the
  `RUNNER_*` ones); GitHub documents that they cannot be overwritten, and that `CI` can.
- act evaluates the job's `defaults.run` for every step (seeing `$GITHUB_ENV` and the step's
  `env:`); GitHub's runner evaluates them once, as the job starts.
- The `env` context: act puts the runner's variables in it (`env.GITHUB_WORKSPACE`); GitHub's
  holds only the workflow's, job's and step's `env:` and GITHUB_ENV's additions.
- The `steps` context: act has the running step and steps without an id in it; GitHub only
  finished steps with an id. `runner.environment` and `strategy.job-index`/`job-total` are
  empty in act (GitHub: `self-hosted`, 0 and 1 without a matrix).
- Object key order: act's `toJSON` sorts keys (Go maps); GitHub keeps insertion order
  (`fromJSON` text order; `outputs`, `outcome`, `conclusion` for a step).
- Expression errors: act runs a step whose `run:` fails to evaluate as an empty script
  (success) and reports a step whose `if:` fails to evaluate as skipped; GitHub fails both,
  and only the first is subject to `continue-on-error`.
- act's evaluator errors where GitHub's gives a value: integer literals beyond 32 bits are a
  workflow error, `fromJSON('1e400')` (Infinity) and comparing two arrays (false) fail, and a
  string like `'.1'` does not convert to a number (documented in docs/expressions.md);
  `.*` on an object does not give its values (`join(obj.*)` is `Object`); `join` with an
  array as separator uses `Array` (GitHub: a non-primitive separator means `,`).
  `if: ''` (GitHub: `success()`) is a schema error in act.
- Masking: two adjacent occurrences of a secret become one `***` on GitHub (its masker
  merges touching matches); act prints `******`.
- act's `toJSON` writes `<`, `>` and `&` as `\\u003c`, `\\u003e`, `\\u0026`; GitHub's (Newtonsoft's)
  leaves them alone.
- Workflow commands: act drops a line naming an unknown command (`::foo::bar`; GitHub prints
  it), does not recognise a command after leading blanks, and lets the disabled `::set-env`
  and `::add-path` pass; GitHub fails the step for them unless
  ACTIONS_ALLOW_UNSECURE_COMMANDS is true, as we do (unit tests).
- Actions: act puts the inputs of a composite action in its steps' environment as `INPUT_*`
  (GitHub does not: a composite action reads `inputs`), and does not check `required`
  inputs (we fail the step, docs/actions.md). Our side is proved in
  tests/integration/executor/test_actions_composite.py.
- act leaves `::group::`/`::endgroup::` lines out of a step's raw output; we pass them to
  Gitea, which folds the log on them. We show `$GITHUB_STEP_SUMMARY` in the step's log (Gitea
  stores no summaries); act ignores it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dynrunner.executor.workflow import parse_workflow
from tests.fixtures.act import act_repo, needs_act, run_act
from tests.fixtures.executor import ExecutorHarness, put_files

pytestmark = [pytest.mark.act, needs_act]

OUR_OWN_ROWS = ("##[", "Failed but continue next step")
HEADERS = ("##[group]Run ", "##[group]Post ")


@dataclass
class Observed:
    result: str
    outcomes: dict[str, str]
    outputs: dict[str, str]
    lines: dict[str, list[str]] = field(default_factory=dict)
    post_lines: list[str] = field(default_factory=list)
    """What the actions' post stages printed, in the order they ran."""


async def observe_act(tmp_path: Path, workflow: str) -> Observed:
    repo = act_repo(tmp_path, {".github/workflows/ci.yml": workflow})
    out, err = await run_act(repo, timeout_s=120)
    job = parse_workflow(workflow).job
    steps = [s.id for s in job.steps]
    outcomes = dict.fromkeys(steps, "skipped")
    outputs: dict[str, str] = {}
    lines: dict[str, list[str]] = {step: [] for step in steps}
    result = ""
    post_lines: list[str] = []
    for raw in out.splitlines():
        entry = json.loads(raw)
        ids = entry.get("stepID") or [""]
        step_id = ids[0]
        if step_id.isdigit():  # act's id of a step without one is its index; ours is `__<index>`
            step_id = f"__{step_id}"
        if "jobResult" in entry:
            result = entry["jobResult"]
        if step_id not in outcomes:
            continue
        printed = entry["msg"].removesuffix("\n").split("\n") if entry.get("raw_output") else []
        if entry.get("stage") == "Post":  # an action's post stage: Gitea shows it under "Complete job"
            post_lines.extend(printed)
            continue
        nested = len(ids) > 1  # a step of a composite action: its rows are its caller's
        if "stepResult" in entry and not nested:
            outcomes[step_id] = entry["stepResult"]
        if entry.get("command") == "set-output" and not nested:
            outputs[f"{step_id}__{entry['name']}"] = entry["arg"]
        lines[step_id].extend(printed)
    assert result, f"act reported no job result:\n{err[-2000:]}"
    declared = {k: v for k, v in outputs.items() if k in job.outputs and v}  # what Gitea keeps of them
    return Observed(result, outcomes, declared, lines, post_lines)


def printed_rows(rows: list[str]) -> list[str]:
    """Rows a step's processes printed: without the headers (`Run …` groups, one per step of
    a composite action, `Post …` groups of post stages) and our own `##[…]` rows."""
    kept, header = [], False
    for row in rows:
        if row.startswith(HEADERS):
            header = True
        elif header and row == "##[endgroup]":
            header = False
        elif not header and not row.startswith(OUR_OWN_ROWS):
            kept.append(row)
    return kept


async def run_ours(harness: ExecutorHarness, workflow: str) -> Observed:
    claimed = await harness.claim(workflow)
    assert await harness.run(claimed) == 0
    task = harness.gitea.task(claimed.task_id)
    steps = parse_workflow(workflow).job.steps
    outcomes = {step.id: task.steps[step.index].status for step in steps}
    lines: dict[str, list[str]] = {}
    for step in steps:
        state = task.steps[step.index]
        lines[step.id] = printed_rows(task.log_rows[state.log_index : state.log_index + state.log_length])
    last = task.steps[-1]
    complete = task.log_rows[last.log_index + last.log_length : -1]  # "Complete job" without "Job …"
    result = {1: "success", 2: "failure", 3: "cancelled", 4: "skipped"}[task.result]
    return Observed(result, outcomes, {k: v for k, v in task.outputs.items() if v}, lines, printed_rows(complete))


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
    "expression-functions": """
on: push
env:
  OBJ: '{"a": 1, "b": [true, null, "x"], "c": {"d": 2.5, "e": {}}, "f": []}'
jobs:
  build:
    runs-on: self-hosted
    outputs:
      fmt__braces: ${{ steps.fmt.outputs.braces }}
    steps:
      - id: fmt
        run: |
          check() { echo "$1"; [ "$1" = "$2" ] || { echo "expected: $2"; exit 1; }; }
          check "${{ format('{{0}} is {0}, {{{1}}} and {0}', 'zero', 1) }}" "{0} is zero, {1} and zero"
          check "${{ format('{0}{1}{2}', null, true, 1.50) }}" "true1.5"
          check "${{ format('{0} {1}', fromJSON('[1]'), fromJSON('{}')) }}" "Array Object"
          check "${{ join(fromJSON('[1, 2.5, true, null, "s"]'), ' | ') }}" "1 | 2.5 | true |  | s"
          check "${{ join('single') }} ${{ join(fromJSON('["a","b"]')) }} ${{ join(fromJSON('[]'), '-') }}." \\
            "single a,b ."
          echo "braces=${{ format('{{{0}}}', 'x') }}" >> "$GITHUB_OUTPUT"
      - id: json
        run: |
          check() { echo "$1"; [ "$1" = "$2" ] || { echo "expected: $2"; exit 1; }; }
          cat <<'EOF2'
          ${{ toJSON(fromJSON(env.OBJ)) }}
          ${{ toJSON(fromJSON('[[1,[2]],{"k":[]}]')) }}
          EOF2
          check '${{ toJSON(fromJSON('[]')) }} ${{ toJSON(fromJSON('{}')) }} ${{ toJSON('s') }}' '[] {} "s"'
          check "${{ toJSON(null) }} ${{ toJSON(1.0) }} ${{ toJSON(true) }} ${{ toJSON(-2.50) }}" "null 1 true -2.5"
          check "${{ fromJSON('3') }} ${{ fromJSON('true') }} [${{ fromJSON('null') }}] ${{ fromJSON('1.50') }}" \\
            "3 true [] 1.5"
          check "${{ fromJSON('"str"') }} ${{ fromJSON('-2e3') }}" "str -2000"
          check "${{ fromJSON('3') == 3 }} ${{ fromJSON('null') == null }}" "true true"
          check "${{ fromJSON(env.OBJ).c.d }} ${{ fromJSON(env.OBJ).b[0] }} ${{ fromJSON(env.OBJ).B[2] }}" "2.5 true x"
          check "${{ fromJSON(env.OBJ).c }} ${{ fromJSON(env.OBJ).f }} [${{ fromJSON(env.OBJ).b[7] }}]" \\
            "Object Array []"
      - id: search
        run: |
          check() { echo "$1"; [ "$1" = "$2" ] || { echo "expected: $2"; exit 1; }; }
          check "${{ contains('Hello World', 'WORLD') }} ${{ contains(fromJSON('[1, 2]'), '2') }}" "true true"
          check "${{ contains(fromJSON('["A"]'), 'a') }} ${{ contains(fromJSON('["ab"]'), 'a') }}" "true false"
          check "${{ contains('abc', '') }} ${{ contains(null, '') }} ${{ contains(123, 2) }}" "true true true"
          check "${{ contains(true, 'ru') }} ${{ contains(fromJSON('[null]'), '') }}" "true true"
          check "${{ startsWith('Hello', 'HE') }} ${{ endsWith('Hello', 'LO') }} ${{ startsWith(123, 1) }}" \\
            "true true true"
          check "${{ endsWith('x', '') }} ${{ startsWith('', 'a') }} ${{ startsWith(fromJSON('[1]'), 1) }}" \\
            "true false false"
      - id: separators-and-loose-contains
        run: |
          check() { echo "$1"; [ "$1" = "$2" ] || { echo "expected: $2"; exit 1; }; }
          check "${{ join(fromJSON('["a","b"]'), 1) }} ${{ join(fromJSON('["a","b"]'), null) }}" "a1b ab"
          check "${{ contains(fromJSON('[1, 2]'), '1.0') }} ${{ contains(fromJSON('[true]'), 1) }}" "true true"
          check "${{ contains(fromJSON('[null]'), 0) }} ${{ format('{0}', fromJSON('1.10')) }}" "true 1.1"
          check "${{ 'a' < 'B' }} ${{ 'Z' > 'a' }} ${{ 1 < '2' }} ${{ '10' > '9' }}" "true true true false"
""",
    "expression-numbers-and-operators": """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: numbers
        run: |
          check() { echo "$1"; [ "$1" = "$2" ] || { echo "expected: $2"; exit 1; }; }
          check "${{ 1.5 }} ${{ 1.0 }} ${{ -0 }} ${{ 0xff }} ${{ 1e3 }} ${{ -1.5 }} ${{ 2147483647 }}" \\
            "1.5 1 0 255 1000 -1.5 2147483647"
          check "${{ fromJSON('1000000000000000000') }} ${{ fromJSON('123456789012345678') }}" \\
            "1E+18 1.23456789012346E+17"
          check "${{ 0.1 }} ${{ 1.23e-7 }} ${{ 2.5e20 }} ${{ 0.000001 }}" "0.1 1.23E-07 2.5E+20 1E-06"
          check "${{ 1234567.891 }} ${{ 3.14159265358979 }} ${{ 0.0001 }} ${{ 0.00001 }}" \\
            "1234567.891 3.14159265358979 0.0001 1E-05"
          check "${{ fromJSON('100000000000000') }} ${{ fromJSON('999999999999999') }}" \\
            "100000000000000 999999999999999"
          check "${{ fromJSON('1000000000000000') }} ${{ fromJSON('12345678901234567890') }}" \\
            "1E+15 1.23456789012346E+19"
          check "${{ fromJSON('0.30000000000000004') }}" "0.3"
      - id: equality
        run: |
          check() { echo "$1"; [ "$1" = "$2" ] || { echo "expected: $2"; exit 1; }; }
          check "${{ 1 == '1' }} ${{ true == 1 }} ${{ null == 0 }} ${{ '' == 0 }} ${{ 'abc' == 0 }}" \\
            "true true true true false"
          check "${{ ' 1 ' == 1 }} ${{ '0x10' == 16 }} ${{ 'true' == true }} ${{ null == false }}" \\
            "true true false true"
          check "${{ null == '' }} ${{ 'ABC' != 'abc' }} ${{ 1 == '1.0' }} ${{ 16 == ' 0x10 ' }}" "true false true true"
          check "${{ 'b' > 'A' }} ${{ 2 > '10' }} ${{ '2' < '10' }} ${{ 1 < 2 }} ${{ null < 1 }}" \\
            "true false false true true"
          check "${{ true > false }} ${{ 'a' < 1 }} ${{ 'a' >= 1 }}" "true false false"
      - id: logic
        run: |
          check() { echo "$1"; [ "$1" = "$2" ] || { echo "expected: $2"; exit 1; }; }
          check "${{ 'a' && 'b' }} ${{ '' || 'fallback' }} [${{ 0 || null }}] [${{ null && 'x' }}]" "b fallback [] []"
          check "${{ !'' }} ${{ !'x' }} ${{ !0 }} ${{ !fromJSON('[]') }} ${{ !null }}" "true false true false true"
          check "${{ 0 && 'x' }} ${{ false || 0 }} ${{ 1 && 2 && 3 }} ${{ 'x' || 'y' }}" "0 0 3 x"
          check "${{ (1 == 1) && 'yes' || 'no' }} ${{ (1 == 2) && 'yes' || 'no' }}" "yes no"
          check "${{ fromJSON('{"a":1}') && 'obj' }} ${{ fromJSON('[1]') || 'x' }}" "obj Array"
""",
    "status-functions": """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      soft__v: ${{ steps.soft.outputs.v }}
      hard__v: ${{ steps.hard.outputs.v }}
      late__v: ${{ steps.late.outputs.v }}
    steps:
      - id: soft
        continue-on-error: true
        run: |
          echo "v=soft-value" >> "$GITHUB_OUTPUT"
          exit 7
      - id: after-soft
        if: success()
        run: echo "success() after a soft failure, job ${{ job.status }}"
      - id: not-failure
        if: failure()
        run: echo "never"
      - id: check
        if: steps.soft.outcome == 'failure' && steps.soft.conclusion == 'success'
        run: |
          echo "outcome ${{ steps.soft.outcome }} conclusion ${{ steps.soft.conclusion }}"
          echo "v=${{ steps.soft.outputs.v }}"
      - id: hard
        run: |
          echo "v=hard-value" >> "$GITHUB_OUTPUT"
          echo "failing now"
          exit 42
      - id: late
        run: echo "v=never" >> "$GITHUB_OUTPUT"
      - id: on-failure
        if: failure()
        run: |
          echo "hard=${{ steps.hard.outcome }}/${{ steps.hard.conclusion }} v=${{ steps.hard.outputs.v }}"
          echo "late=${{ steps.late.outcome }}/${{ steps.late.conclusion }} v=[${{ steps.late.outputs.v }}]"
          echo "job ${{ job.status }}"
      - id: cancelled
        if: cancelled()
        run: echo "never"
      - id: always-or
        if: always() && steps.hard.outcome == 'failure'
        run: echo "always() with a condition"
      - id: failure-and
        if: failure() && steps.soft.outcome == 'failure'
        run: echo "failure() with a condition"
      - id: success-or-failure
        if: success() || failure()
        run: echo "success() || failure()"
      - id: not-cancelled
        if: ${{ !cancelled() }}
        run: echo "!cancelled()"
      - id: plain-condition
        if: steps.hard.outcome == 'failure'
        run: echo "never, implicit success()"
      - id: failure-soft2
        if: failure()
        continue-on-error: true
        run: exit 3
      - id: still-failure
        if: failure()
        run: echo "after ${{ steps.failure-soft2.outcome }}/${{ steps.failure-soft2.conclusion }}"
""",
    "env-precedence": """
on: push
env:
  A: workflow-a
  B: workflow-b
  C: workflow-c
  WF_NUM: 3
  WF_BOOL: true
  WF_FLOAT: 1.50
jobs:
  build:
    runs-on: self-hosted
    env:
      B: job-b
      C: job-c
      FROM_WF: ${{ github.event_name }}-x
    steps:
      - id: one
        env:
          C: step-c
          D: ${{ env.B }}
        run: |
          echo "A=$A B=$B C=$C D=$D FROM_WF=$FROM_WF num=$WF_NUM bool=$WF_BOOL float=$WF_FLOAT"
          echo "ctx: ${{ env.A }} ${{ env.B }} ${{ env.C }} ${{ env.D }} [${{ env.NOPE }}]"
          echo "B=from-file" >> "$GITHUB_ENV"
          echo "C=from-file" >> "$GITHUB_ENV"
          echo "NEW=new-from-file" >> "$GITHUB_ENV"
          echo "after write in same step B=$B"
      - id: two
        env:
          C: step-c-2
        run: |
          echo "A=$A B=$B C=$C NEW=$NEW"
          echo "ctx: ${{ env.B }} ${{ env.C }} ${{ env.NEW }}"
      - id: three
        env:
          NEW: ${{ env.NEW }}-step
        run: |
          echo "NEW=$NEW"
          echo "EMPTY=" >> "$GITHUB_ENV"
          echo "A=" >> "$GITHUB_ENV"
      - id: four
        env:
          OWN: own-value
        run: |
          echo "own=${{ env.OWN }} $OWN"
          echo "EMPTY=[${EMPTY-unset}] A=[${A-unset}] ctx=[${{ env.A }}]"
""",
    "path-order-and-multiline-outputs": """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      one__multi: ${{ steps.one.outputs.multi }}
      one__empty: ${{ steps.one.outputs.empty }}
      one__eq: ${{ steps.one.outputs.eq }}
      one__twice: ${{ steps.one.outputs.twice }}
      one__blank: ${{ steps.one.outputs.blank }}
    steps:
      - id: one
        run: |
          for d in first second; do
            mkdir -p "$RUNNER_TEMP/$d"
            printf '#!/bin/sh\\necho tool from %s\\n' "$d" > "$RUNNER_TEMP/$d/tool"
            chmod +x "$RUNNER_TEMP/$d/tool"
          done
          echo "$RUNNER_TEMP/first" >> "$GITHUB_PATH"
          echo "$RUNNER_TEMP/second" >> "$GITHUB_PATH"
          { echo "multi<<EOF"; echo "line one"; echo ""; echo "  indented"; echo "EOF"; } >> "$GITHUB_OUTPUT"
          echo "empty=" >> "$GITHUB_OUTPUT"
          echo "eq=a=b=c" >> "$GITHUB_OUTPUT"
          echo "twice=first" >> "$GITHUB_OUTPUT"
          echo "twice=second" >> "$GITHUB_OUTPUT"
          { echo "blank<<X"; echo "X"; } >> "$GITHUB_OUTPUT"
      - id: two
        run: |
          tool
          echo "multi=[${{ steps.one.outputs.multi }}]"
          echo "empty=[${{ steps.one.outputs.empty }}] eq=${{ steps.one.outputs.eq }}"
          echo "twice=${{ steps.one.outputs.twice }} blank=[${{ steps.one.outputs.blank }}]"
      - id: three
        run: |
          mkdir -p "$RUNNER_TEMP/third"
          printf '#!/bin/sh\\necho tool from third\\n' > "$RUNNER_TEMP/third/tool"
          chmod +x "$RUNNER_TEMP/third/tool"
          echo "$RUNNER_TEMP/third" >> "$GITHUB_PATH"
          tool
      - id: four
        run: tool
""",
    "path-from-env-files": """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: tools
        run: |
          for d in a b c; do
            mkdir -p "$RUNNER_TEMP/$d"
            printf '#!/bin/sh\\necho "%s"\\n' "$d" > "$RUNNER_TEMP/$d/which-dir"
            chmod +x "$RUNNER_TEMP/$d/which-dir"
          done
          echo "$RUNNER_TEMP/a" >> "$GITHUB_PATH"
          echo "TOOL_DIR_C=$RUNNER_TEMP/c" >> "$GITHUB_ENV"
      - id: env-path
        run: |
          which-dir
          echo "PATH=$TOOL_DIR_C:$PATH" >> "$GITHUB_ENV"
      - id: after-env-path
        run: which-dir
      - id: path-again
        run: |
          echo "$RUNNER_TEMP/b" >> "$GITHUB_PATH"
      - id: final
        run: which-dir
      - id: step-env-path
        env:
          PATH: /usr/bin:/bin
        run: |
          command -v which-dir >/dev/null && echo "found" || echo "not found with a step PATH"
""",
    "env-file-details": """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      one__Answer: ${{ steps.one.outputs.answer }}
      one__both: ${{ steps.one.outputs.both }}
      one__tmpl: ${{ steps.one.outputs.tmpl }}
    steps:
      - id: one
        run: |
          echo "Answer=mixed case" >> "$GITHUB_OUTPUT"
          echo "::set-output name=both::from command"
          echo "both=from file" >> "$GITHUB_OUTPUT"
          echo 'tmpl=${{ github.event_name }}' >> "$GITHUB_OUTPUT"
          echo 'TEMPLATED=${{ github.event_name }}' >> "$GITHUB_ENV"
          echo "spaced = value " >> "$GITHUB_OUTPUT"
          echo "lower=1" >> "$GITHUB_ENV"
      - id: names
        run: |
          echo "my-out=hyphen" >> "$GITHUB_OUTPUT"
          echo "a.b=dotted" >> "$GITHUB_OUTPUT"
          echo "_u=underscore" >> "$GITHUB_OUTPUT"
      - id: two
        env:
          OWN: own-value
        run: |
          echo "${{ steps.names.outputs.my-out }} ${{ steps.names.outputs['a.b'] }} ${{ steps.names.outputs._u }}"
          echo "answer=${{ steps.one.outputs.answer }} ANSWER=${{ steps.one.outputs.ANSWER }}"
          echo "both=${{ steps.one.outputs.both }}"
          echo "tmpl=${{ steps.one.outputs.tmpl }} TEMPLATED=$TEMPLATED"
          echo "own=${{ env.OWN }} lower=$lower"
          echo "roundtrip=${{ fromJSON(toJSON(steps.one.outputs)).both }}"
          echo "spaced=[${{ steps.one.outputs.spaced }}] [${{ steps.one.outputs['spaced '] }}]"
""",
    "defaults-workflow": """
on: push
defaults:
  run:
    shell: sh
    working-directory: wf-dir
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: mk
        working-directory: .
        run: mkdir -p wf-dir/sub job-dir && echo made
      - id: wf-defaults
        run: |
          echo "dir=$(basename "$PWD")"
          if [ -n "${BASH_VERSION:-}" ]; then echo bash; else echo not-bash; fi
      - id: step-override
        shell: bash
        working-directory: wf-dir/sub
        run: echo "dir=$(basename "$PWD") bash=${BASH_VERSION:+yes}"
""",
    "defaults-job-over-workflow": """
on: push
defaults:
  run:
    shell: sh
    working-directory: wf-dir
jobs:
  build:
    runs-on: self-hosted
    defaults:
      run:
        shell: python
    steps:
      - id: mk
        shell: bash
        working-directory: .
        run: mkdir -p wf-dir job-dir && echo made
      - id: job-shell-wf-dir
        run: |
          import os, sys
          print("dir", os.path.basename(os.getcwd()))
          print("python", sys.version_info[0])
""",
    "shells-and-exit-codes": """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: sh-e
        shell: sh
        continue-on-error: true
        run: |
          echo before
          false
          echo after
      - id: bash-default
        continue-on-error: true
        run: |
          echo "$0" | grep -q '\\.sh$' && echo "script ends with .sh"
          set -o | grep -E '^(errexit|pipefail)' | tr -s ' \\t' ' '
          exit 5
      - id: bash-explicit
        shell: bash
        run: |
          set -o | grep -E '^(errexit|pipefail)' | tr -s ' \\t' ' '
      - id: python-exit
        shell: python
        continue-on-error: true
        run: |
          import sys
          print("python exits 3")
          sys.exit(3)
      - id: custom-perl
        shell: perl {0}
        run: |
          print "perl says hi\\n";
      - id: custom-python
        shell: python3 -u {0}
        run: |
          print("custom python")
      - id: custom-bash-args
        shell: bash -eo pipefail {0}
        continue-on-error: true
        run: |
          false | true
          echo "never"
      - id: bytes-and-escapes
        run: |
          printf 'bad \\xff byte\\n'
          printf '   \\n'
          printf '\\033[31mred\\033[0m\\n'
          echo "::set-output name=v::a%0Ab%25c"
      - id: read-escaped
        run: echo "${{ steps.bytes-and-escapes.outputs.v }}"
      - id: bash-no-e
        shell: bash {0}
        run: |
          false
          echo "bash without -e goes on"
      - id: exit-256
        run: exit 256
      - id: or-true
        run: |
          false || echo "false || echo"
          ! false
          echo "negated"
      - id: report
        if: always()
        run: |
          echo "${{ steps.sh-e.outcome }} ${{ steps.bash-default.outcome }} ${{ steps.python-exit.outcome }}"
          echo "${{ steps.custom-bash-args.outcome }} ${{ steps.exit-256.outcome }}"
""",
    "contexts": """
on: push
jobs:
  build:
    runs-on: self-hosted
    strategy:
      matrix:
        flavour: [vanilla]
        n: [1]
    steps:
      - id: ctx
        run: |
          check() { echo "$1"; [ "$1" = "$2" ] || { echo "expected: $2"; exit 1; }; }
          check "${{ github.job }} ${{ github.event_name }} ${{ runner.os }} ${{ job.status }}" \\
            "build push Linux success"
          check "${{ github.action }} $GITHUB_ACTION $GITHUB_JOB" "ctx ctx build"
          check "$CI $GITHUB_ACTIONS $RUNNER_OS $GITHUB_EVENT_NAME" "true true Linux push"
          check "${{ github.ref }} ${{ github.ref_name }} ${{ github.ref_type }} $GITHUB_REF" \\
            "refs/heads/main main branch refs/heads/main"
          check "${{ github.workflow }} ${{ github.run_attempt }} ${{ github.event_path != '' }}" "ci.yml 1 true"
          check "${{ matrix.flavour }} ${{ matrix.n }} ${{ strategy.fail-fast }}" "vanilla 1 true"
          check "${{ toJSON(needs) }} ${{ toJSON(inputs) }} ${{ toJSON(vars) }}" "{} {} {}"
          check "${{ GITHUB.EVENT_NAME }} ${{ Runner.OS }} ${{ github['job'] }} ${{ matrix['FLAVOUR'] }}" \\
            "push Linux build vanilla"
          echo "${{ toJSON(matrix) }}"
      - id: second
        run: |
          check() { echo "$1"; [ "$1" = "$2" ] || { echo "expected: $2"; exit 1; }; }
          check "${{ steps.ctx.outcome }} ${{ toJSON(steps.ctx.outputs) }} ${{ steps.CTX.conclusion }}" \\
            "success {} success"
""",
    "if-forms": """
on: push
env:
  FLAG: "yes"
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: s1
        if: ${{ github.event_name == 'push' }}
        run: echo "wrapped if"
      - id: s2
        if: github.event_name == 'pull_request'
        run: echo "never"
      - id: s3
        if: ${{ github.event_name }} == 'pull_request'
        run: echo "text around an expression is always true"
      - id: s4
        if: 0
        run: echo "never, zero"
      - id: s5
        if: "'false'"
        run: echo "a non-empty string is true"
      - id: s6
        if: env.FLAG == 'YES'
        run: echo "env in if, case-insensitive compare"
      - id: s7
        if: ${{ false }}
        run: echo "never"
      - id: s8
        if: false
        run: echo "never"
      - id: s9
        if: steps.s7.outcome == 'skipped' && steps.s7.conclusion == 'skipped'
        run: echo "s7 skipped, s1 ${{ steps.s1.outcome }}"
      - id: s10
        if: contains(fromJSON('["push", "x"]'), github.event_name) && startsWith(github.ref, 'refs/heads/')
        run: echo "functions in if"
      - id: s11
        if: ${{ !startsWith(github.ref, 'refs/tags/') }}
        run: echo "negated"
      - id: s12
        if: GITHUB.EVENT_NAME == 'push' && Steps.S1.Outcome == 'success'
        run: echo "contexts and properties ignore case ${{ STEPS.s1.OUTCOME }}"
""",
    "step-env-and-working-directory": """
on: push
env:
  X: workflow-x
jobs:
  build:
    runs-on: self-hosted
    env:
      Y: job-y
    steps:
      - id: same-step
        env:
          X: step-x
          SEEN_X: ${{ env.X }}
          SEEN_Y: ${{ env.Y }}
          NUM: ${{ 1.50 }}
          BOOL: ${{ 1 == 1 }}
          NULLISH: ${{ null }}
          JSON: "${{ toJSON(fromJSON('{\\"k\\": [1, \\"v\\"]}')) }}"
          MIXED: pre-${{ 1 }}-${{ 'mid' }}-${{ true }}-post
          QUOTE: ${{ 'It''s' }}
        run: |
          echo "X=$X SEEN_X=$SEEN_X SEEN_Y=$SEEN_Y NUM=$NUM BOOL=$BOOL NULLISH=[$NULLISH]"
          echo "$JSON"
          echo "$MIXED $QUOTE"
      - id: wd
        env:
          DIR: sub
        run: mkdir -p sub/deeper && echo made
      - id: wd-expr
        working-directory: ${{ env.X == 'workflow-x' && 'sub' || 'nope' }}/deeper
        run: echo "in $(basename "$PWD")"
      - id: wd-missing
        continue-on-error: true
        working-directory: does-not-exist
        run: echo "never"
      - id: after
        run: echo "${{ steps.wd-missing.outcome }}"
""",
    "log-output-and-commands": """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: text
        run: |
          echo "::add-mask::hunter2"
          echo "the password is hunter2, and again: hunter2."
          echo "::warning::careful"
          echo "::notice title=T::noted"
          echo "::debug::hidden"
          echo "to stderr" >&2
          echo "héllo ✓ — ünïcode"
          echo
          echo "   leading and trailing spaces   "
          printf 'tab\\there\\n'
          printf 'no newline at the end'
      - id: command-lookalikes
        run: |
          echo "x ::warning::not a command, it does not start the line"
          echo "::WARNING::command names ignore case"
          echo "::warning"
          echo "##[set-output name=legacy;]the legacy form"
          echo "##[warning]a legacy warning"
      - id: read-legacy
        run: echo "legacy=${{ steps.command-lookalikes.outputs.legacy }}"
""",
    "job-env-and-defaults-from-the-matrix": """
on: push
jobs:
  build:
    runs-on: self-hosted
    strategy:
      matrix:
        dir: [sub]
    env:
      FROM_MATRIX: m-${{ matrix.dir }}
      MULTI: "line1\\nline2"
    defaults:
      run:
        working-directory: ${{ matrix.dir }}
    steps:
      - id: mk
        working-directory: .
        run: mkdir -p sub && echo made
      - id: in-sub
        run: |
          echo "dir=$(basename "$PWD") from=$FROM_MATRIX"
          echo "$MULTI"
          printf '%s\\n' "${{ env.MULTI }}"
      - id: interleaved
        run: |
          echo out-1
          echo err-1 >&2
          echo out-2
          echo err-2 >&2
      - id: json-escapes
        run: |
          cat <<'EOF'
          ${{ toJSON(fromJSON('{"quote": "\\"", "tab": "\\t", "u": "\\u00e9\\u2028"}')) }}
          ${{ toJSON('a"b\\c''d') }}
          EOF
""",
    "if-block-scalars": """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: multi-line
        if: |
          github.event_name == 'push' &&
          startsWith(github.ref, 'refs/heads/')
        run: echo "multi-line condition"
      - id: folded
        if: >-
          github.event_name == 'pull_request'
          || false
        run: echo "never"
      - id: block-expression
        if: |
          ${{ false }}
        run: echo "block with a trailing newline"
      - id: folded-expression
        if: >-
          ${{ false }}
        run: echo "never, folded without newline"
      - id: spaced
        if: "  ${{ false }}  "
        run: echo "spaces around"
""",
}


# Actions from the workspace: each workflow's first step copies the action sources (written to
# a directory of the test, the same for both runners) into the workspace, as a checkout would.
ACTIONS: dict[str, dict[str, str]] = {
    "composite": {
        ".github/actions/greet/action.yml": """
name: greet
inputs:
  who:
    required: true
  greeting:
    default: hello
  shout:
    default: 'false'
outputs:
  said:
    value: ${{ steps.say.outputs.text }}
  upper:
    value: ${{ steps.loud.outputs.text }}
runs:
  using: composite
  steps:
    - id: say
      shell: bash
      run: |
        echo "${{ inputs.greeting }}, ${{ inputs.who }} (from $(basename "$GITHUB_ACTION_PATH"))"
        echo "text=${{ inputs.greeting }} ${{ inputs.who }}" >> "$GITHUB_OUTPUT"
    - id: loud
      if: inputs.shout == 'true'
      shell: bash
      env:
        WORDS: ${{ steps.say.outputs.text }}
      run: echo "text=${WORDS^^}" >> "$GITHUB_OUTPUT"
    - shell: sh
      run: echo "outer env $OUTER, say=${{ steps.say.outcome }} loud=${{ steps.loud.outcome }}"
""",
        ".github/actions/outer/action.yml": """
name: outer
inputs:
  name:
    default: nobody
  fail:
    default: 'false'
outputs:
  result:
    value: ${{ steps.inner.outputs.said }}/${{ steps.inner.outputs.upper }}
runs:
  using: composite
  steps:
    - id: inner
      uses: ./.github/actions/greet
      with:
        who: ${{ inputs.name }}
        shout: 'true'
    - shell: bash
      run: |
        echo "inner said ${{ steps.inner.outputs.said }}"
        echo "FROM_NESTED=${{ inputs.name }}" >> "$GITHUB_ENV"
        mkdir -p "$RUNNER_TEMP/nested-bin"
        printf '#!/bin/sh\\necho nested tool\\n' > "$RUNNER_TEMP/nested-bin/nested-tool"
        chmod +x "$RUNNER_TEMP/nested-bin/nested-tool"
        echo "$RUNNER_TEMP/nested-bin" >> "$GITHUB_PATH"
    - id: bad
      if: inputs.fail == 'true'
      shell: bash
      run: |
        echo "failing on purpose"
        exit 4
    - if: failure()
      shell: bash
      run: echo "failure() inside after ${{ steps.bad.outcome }}"
    - shell: bash
      run: echo "only without a failure"
    - if: always()
      shell: bash
      working-directory: .github
      run: echo "always in $(basename "$PWD")"
    - id: soft
      if: always()
      continue-on-error: true
      shell: bash
      run: exit 2
    - if: always()
      shell: bash
      run: echo "soft=${{ steps.soft.outcome }}/${{ steps.soft.conclusion }}"
""",
    },
    "node": {
        "js/action.yml": """
name: js
inputs:
  who:
    default: nobody
  fail:
    default: 'false'
outputs:
  greeting:
    description: what it said
runs:
  using: node20
  pre: pre.js
  main: main.js
  post: post.js
""",
        "js/pre.js": "console.log('pre of a local action: never run');\n",
        "js/main.js": """
const fs = require('fs');
const env = process.env;
console.log(`main ${env.INPUT_WHO} in the workspace: ${process.cwd() === env.GITHUB_WORKSPACE}`);
fs.appendFileSync(env.GITHUB_OUTPUT, `greeting=hello ${env.INPUT_WHO}\\n`);
fs.appendFileSync(env.GITHUB_STATE, `who=${env.INPUT_WHO}\\n`);
console.log('::save-state name=legacy::saved');
console.log(`::set-output name=legacy::${env.INPUT_WHO}`);
if (env.INPUT_FAIL === 'true') {
  console.log('failing');
  process.exitCode = 3;
}
""",
        "js/post.js": """
console.log(`post for ${process.env.STATE_who} (${process.env.STATE_legacy})`);
""",
        "js-cond/action.yml": """
runs:
  using: node20
  main: main.js
  post: post.js
  post-if: failure()
""",
        "js-cond/main.js": "console.log('conditional main');\n",
        "js-cond/post.js": "console.log('post because the job failed');\n",
    },
}

ACTION_WORKFLOWS = {
    "composite-actions": (
        "composite",
        """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      ok__result: ${{ steps.ok.outputs.result }}
      direct__said: ${{ steps.direct.outputs.said }}
      fails__result: ${{ steps.fails.outputs.result }}
    steps:
      - run: cp -R "ACTION_SRC/." .
      - id: direct
        uses: ./.github/actions/greet
        env:
          OUTER: from-the-step
        with:
          who: you
          greeting: hi
      - id: ok
        uses: ./.github/actions/outer
        with:
          name: world
      - run: |
          echo "after: $FROM_NESTED $(nested-tool) ${{ steps.ok.outputs.result }} ${{ steps.ok.outcome }}"
      - id: fails
        uses: ./.github/actions/outer
        continue-on-error: true
        with:
          name: again
          fail: 'true'
      - run: echo "fails ${{ steps.fails.outcome }}/${{ steps.fails.conclusion }} ${{ steps.fails.outputs.result }}"
""",
    ),
    "node-actions": (
        "node",
        """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      one__greeting: ${{ steps.one.outputs.greeting }}
      one__legacy: ${{ steps.one.outputs.legacy }}
    steps:
      - run: cp -R "ACTION_SRC/." .
      - id: one
        uses: ./js
        with:
          who: first
      - uses: ./js-cond
      - id: two
        uses: ./js
        continue-on-error: true
        with:
          who: second
          fail: 'true'
      - run: echo "${{ steps.one.outputs.greeting }} ${{ steps.two.outcome }}/${{ steps.two.conclusion }}"
      - id: three
        uses: ./js
        with:
          who: third
          fail: 'true'
      - run: echo "not after a failure"
""",
    ),
}


async def compare(harness: ExecutorHarness, tmp_path: Path, workflow: str) -> None:
    # Both at once: act is a child process, our executor runs in this event loop.
    theirs, ours = await asyncio.gather(observe_act(tmp_path / "act", workflow), run_ours(harness, workflow))
    if ours.lines != theirs.lines or ours.post_lines != theirs.post_lines:
        # act's host-mode capture, under load, now and then drops a failing step's last
        # line or adds an empty one; a real difference shows in a second, quiet run as well.
        theirs = await observe_act(tmp_path / "act-again", workflow)
    assert ours.outcomes == theirs.outcomes
    assert ours.outputs == theirs.outputs
    assert ours.result == theirs.result
    assert ours.lines == theirs.lines
    assert ours.post_lines == theirs.post_lines


@pytest.mark.parametrize("name", sorted(WORKFLOWS))
async def test_same_outcomes_outputs_and_lines_as_act(
    name: str, executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    await compare(executor_harness, tmp_path, WORKFLOWS[name])


@pytest.mark.parametrize("name", sorted(ACTION_WORKFLOWS))
async def test_actions_from_the_workspace_as_act_runs_them(
    name: str, executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    files, workflow = ACTION_WORKFLOWS[name]
    source = tmp_path / "action-src"
    put_files(source, ACTIONS[files])
    await compare(executor_harness, tmp_path, workflow.replace("ACTION_SRC", str(source)))
