"""`run:` steps end to end: the executor against the Gitea double, read back through Gitea's view."""

from __future__ import annotations

import pytest

from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.task_rows import output_rows, step_rows

LAYERS = """
on: push
env:
  LEVEL: workflow
  FROM_WORKFLOW: w
jobs:
  build:
    runs-on: self-hosted
    env:
      LEVEL: job
      FROM_JOB: ${{ github.repository }}
    outputs:
      answer: ${{ steps.calc.outputs.answer }}
      multi: ${{ steps.calc.outputs.multi }}
      status: ${{ job.status }}
    steps:
      - id: calc
        env:
          LEVEL: step
        run: |
          echo "level=$LEVEL wf=$FROM_WORKFLOW job=$FROM_JOB"
          echo "answer=42" >> "$GITHUB_OUTPUT"
          { echo "multi<<EOF"; echo "one"; echo "two"; echo "EOF"; } >> "$GITHUB_OUTPUT"
          echo "ADDED=from-env-file" >> "$GITHUB_ENV"
          mkdir -p "$RUNNER_TEMP/bin" && printf '#!/bin/sh\\necho tool-ran\\n' > "$RUNNER_TEMP/bin/mytool"
          chmod +x "$RUNNER_TEMP/bin/mytool" && echo "$RUNNER_TEMP/bin" >> "$GITHUB_PATH"
      - name: second sees ${{ steps.calc.outputs.answer }}
        run: |
          echo "level=$LEVEL added=$ADDED answer=${{ steps.calc.outputs.answer }}"
          mytool
      - id: broken
        run: exit 4
        continue-on-error: true
      - id: after
        if: ${{ steps.broken.outcome == 'failure' && steps.broken.conclusion == 'success' && success() }}
        run: echo "broken outcome=${{ steps.broken.outcome }} conclusion=${{ steps.broken.conclusion }}"
      - if: failure()
        run: echo never
"""


async def test_env_layers_env_files_outputs_and_step_results(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(LAYERS)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS
    assert [s.status for s in task.steps] == ["success", "success", "failure", "success", "skipped"]
    assert output_rows(task, 0) == ["level=step wf=w job=owner/repo"]
    assert output_rows(task, 1) == ["level=job added=from-env-file answer=42", "tool-ran"]
    assert task.steps[1].name  # Gitea's own display name; ours goes into the header
    assert output_rows(task, 2) == [
        "##[error]Process completed with exit code 4.",
        "Failed but continue next step (continue-on-error)",
    ]
    assert output_rows(task, 3) == ["broken outcome=failure conclusion=success"]
    assert task.steps[4].log_length == 0
    assert task.outputs == {"answer": "42", "multi": "one\ntwo", "status": "success"}
    assert task.log_rows[-1] == "Job succeeded"


async def test_log_rows_are_exactly_what_the_step_printed(executor_harness: ExecutorHarness) -> None:
    workflow = """
on: push
jobs:
  logs:
    runs-on: self-hosted
    steps:
      - run: |
          for i in $(seq 1 3000); do echo "line $i"; done
          printf 'crlf\\r\\nbare-cr\\rlast-without-newline'
      - run: printf '\\xff\\xfe invalid utf-8 \\xc3\\xa9\\n'; echo "" ; echo "  indented"
"""
    claimed = await executor_harness.claim(workflow)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert output_rows(task, 0) == [f"line {i}" for i in range(1, 3001)] + ["crlf", "bare-cr", "last-without-newline"]
    assert output_rows(task, 1) == ["\ufffd\ufffd invalid utf-8 é", "", "  indented"]
    # every row is in exactly one section: setup, a step, or the closing line
    assert task.steps[0].log_index + task.steps[0].log_length == task.steps[1].log_index
    assert task.steps[1].log_index + task.steps[1].log_length == task.log_length - 1


MASKING = """
on: push
jobs:
  secrets:
    runs-on: self-hosted
    steps:
      - env:
          PASSWORD: ${{ secrets.PASSWORD }}
          MULTI: ${{ secrets.MULTI }}
        run: |
          echo "password=$PASSWORD"
          echo "b64=$(printf '%s' "$PASSWORD" | base64)"
          echo "$MULTI"
          echo "task token=${{ github.token }} runtime=$ACTIONS_RUNTIME_TOKEN"
          value=$(printf 'dynamic-%s' value-123)
          echo "::add-mask::$value"
          echo "later $value"
          echo "not secret"
"""


async def test_secrets_tokens_and_added_masks_never_reach_the_log(executor_harness: ExecutorHarness) -> None:
    secrets = {"PASSWORD": "hunter2-very-secret", "MULTI": "first-line-secret\nsecond-line-secret"}
    claimed = await executor_harness.claim(MASKING, secrets=secrets)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    log = "\n".join(task.log_rows)
    context = claimed.task.context or {}
    for value in (
        "hunter2-very-secret",
        "first-line-secret",
        "second-line-secret",
        "dynamic-value-123",
        str(context["token"]),
        str(context["gitea_runtime_token"]),
        "aHVudGVyMi12ZXJ5LXNlY3JldA==",  # base64 of the password
    ):
        assert value not in log, value
    rows = output_rows(task, 0)
    assert rows[0] == "password=***"
    assert rows[-2:] == ["later ***", "not secret"]
    assert "task token=*** runtime=***" in rows


OWN_CREDENTIALS = """
on: push
jobs:
  upload:
    runs-on: self-hosted
    steps:
      - run: echo "key=$AWS_SECRET_ACCESS_KEY session=$AWS_SESSION_TOKEN id=$AWS_ACCESS_KEY_ID"
"""


async def test_the_executors_own_store_credentials_are_masked(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps inherit the executor's S3 credentials (the artifact CLI needs them); the secret ones
    never reach the log."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-example-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token-example-value")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEID")
    claimed = await executor_harness.claim(OWN_CREDENTIALS)
    assert await executor_harness.run(claimed) == 0
    rows = executor_harness.gitea.task(claimed.task_id).log_rows
    assert "key=*** session=*** id=AKIAEXAMPLEID" in rows


SHELLS = """
on: push
jobs:
  shells:
    runs-on: self-hosted
    defaults:
      run:
        working-directory: sub
    steps:
      - working-directory: .
        run: mkdir -p sub/deeper && echo "made"
      - run: pwd | sed "s|$GITHUB_WORKSPACE|WS|"
      - shell: bash
        run: false | true; echo "pipefail did not stop bash"
        continue-on-error: true
      - shell: sh
        run: echo "sh $(basename "$0") in $(basename "$(dirname "$(dirname "$0")")")"
      - shell: python
        working-directory: sub/deeper
        run: |
          import os, sys
          print("python", os.getcwd().endswith("sub/deeper"), sys.argv[0].endswith(".py"))
      - shell: bash -x {0}
        run: echo traced
      - run: echo "default shell keeps going"; false; echo unreachable
        continue-on-error: true
      - working-directory: missing
        run: echo never
"""


async def test_shells_and_working_directories(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(SHELLS)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    statuses = [s.status for s in task.steps]
    assert statuses == ["success", "success", "failure", "success", "success", "success", "failure", "failure"]
    assert output_rows(task, 1) == ["WS/sub"]
    assert output_rows(task, 2)[0] == "##[error]Process completed with exit code 1."
    assert any(
        row.startswith("shell: ") and row.endswith("bash --noprofile --norc -e -o pipefail {0}")
        for row in step_rows(task, 2)
    )
    assert output_rows(task, 3) == ["sh run.sh in 3"]  # .dynrunner/steps/3/scripts/run.sh: the 4th set of files
    assert output_rows(task, 4) == ["python True True"]
    assert output_rows(task, 5) == ["+ echo traced", "traced"]
    assert output_rows(task, 6)[:2] == ["default shell keeps going", "##[error]Process completed with exit code 1."]
    assert "with working directory" in output_rows(task, 7)[0] and output_rows(task, 7)[0].startswith("##[error]")
    assert task.result == Result.FAILURE


ENVIRONMENT = """
on: push
jobs:
  envcheck:
    runs-on: self-hosted
    steps:
      - id: show
        run: |
          for v in CI GITHUB_ACTIONS GITEA_ACTIONS GITHUB_REPOSITORY GITHUB_JOB GITHUB_RUN_ID GITHUB_REF \\
                   RUNNER_OS RUNNER_ENVIRONMENT GITHUB_GRAPHQL_URL GITHUB_ACTION; do echo "$v=${!v}"; done
          [ "$GITHUB_SERVER_URL" = "${{ github.server_url }}" ] && echo server-matches-context
          [ "$ACTIONS_RUNTIME_URL" = "$GITHUB_SERVER_URL/api/actions_pipeline/" ] && echo runtime-url-ok
          [ "$GITHUB_API_URL" = "$GITHUB_SERVER_URL/api/v1" ] && echo api-url-ok
          [ "$PWD" = "$GITHUB_WORKSPACE" ] && echo in-workspace
          [ -d "$RUNNER_TEMP" ] && [ -d "$RUNNER_TOOL_CACHE" ] && echo dirs-exist
          python3 -c "import json,os; print('event', json.load(open(os.environ['GITHUB_EVENT_PATH']))['ref'])"
          echo "runner ${{ runner.os }} ${{ runner.environment }} job ${{ github.job }} status ${{ job.status }}"
"""


async def test_the_environment_a_gitea_runner_gives(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(ENVIRONMENT)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    rows = output_rows(task, 0)
    context = claimed.task.context or {}
    assert rows[:11] == [
        "CI=true",
        "GITHUB_ACTIONS=true",
        "GITEA_ACTIONS=true",
        "GITHUB_REPOSITORY=owner/repo",
        "GITHUB_JOB=envcheck",
        f"GITHUB_RUN_ID={context['run_id']}",
        "GITHUB_REF=refs/heads/main",
        "RUNNER_OS=Linux",
        "RUNNER_ENVIRONMENT=self-hosted",
        "GITHUB_GRAPHQL_URL=",
        "GITHUB_ACTION=show",
    ]
    assert rows[11:] == [
        "server-matches-context",
        "runtime-url-ok",
        "api-url-ok",
        "in-workspace",
        "dirs-exist",
        "event refs/heads/main",
        "runner Linux self-hosted job envcheck status success",
    ]


NUL_ENV = """
on: push
jobs:
  nul:
    runs-on: self-hosted
    steps:
      - run: printf 'BAD=a\\0b\\nGOOD=fine\\n' >> "$GITHUB_ENV"
      - run: echo "next step sees GOOD=$GOOD"
      - if: always()
        env:
          "A=B": x
        run: echo "never started"
      - if: always()
        run: echo "cleanup runs"
"""


async def test_a_nul_in_github_env_fails_the_writing_step_not_every_later_one(
    executor_harness: ExecutorHarness,
) -> None:
    claimed = await executor_harness.claim(NUL_ENV)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert [s.status for s in task.steps] == ["failure", "skipped", "failure", "success"]
    log = "\n".join(task.log_rows)
    assert "##[error]$GITHUB_ENV: variable 'BAD' contains a NUL character" in task.log_rows
    assert "illegal environment variable name in its environment" in log
    assert "cleanup runs" in task.log_rows
