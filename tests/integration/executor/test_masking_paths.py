"""Secrets on the less travelled paths to the job log: error messages that quote what a step
wrote, and lines too long for one row."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness

# A JWT-like token: long, one line, no '=' (base64url without padding).
TOKEN = "eyJhbGciOiJSUzI1NiJ9." + "".join(f"{i:03d}abcXYZ" for i in range(60)) + ".signature-part-0123456789"

TOKEN_INTO_ENV = """
on: push
jobs:
  envfile:
    runs-on: self-hosted
    steps:
      - env:
          T: ${{ secrets.T }}
        run: echo "$T" >> "$GITHUB_ENV"
"""


async def test_a_secret_written_malformed_to_an_env_file_is_masked_in_the_error(
    executor_harness: ExecutorHarness,
) -> None:
    """A classic mistake: the error quotes the line, and the quote must not show a piece of the token."""
    claimed = await executor_harness.claim(TOKEN_INTO_ENV, secrets={"T": TOKEN})
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    log = "\n".join(task.log_rows)
    assert "Invalid format '***'" in log
    assert TOKEN[:30] not in log


LONG_LINE = """
on: push
jobs:
  long:
    runs-on: self-hosted
    steps:
      - env:
          S: ${{ secrets.S }}
        shell: python
        run: |
          import os, sys, time
          s = os.environ["S"].encode()
          out = sys.stdout.buffer
          out.write(b"a" * ((1 << 20) - 10) + s[:10])
          out.flush()
          time.sleep(0.5)
          out.write(s[10:] + b" and the rest of the line\\n")
          out.flush()
          print("after the long line", flush=True)
"""


async def test_a_secret_across_the_cut_of_an_over_long_line_is_not_shown(executor_harness: ExecutorHarness) -> None:
    """A line longer than the reader keeps is cut; the part after the cut must not start a row of
    its own, where the tail of a secret spanning the cut would escape the mask."""
    secret = "s3cr3t-spanning-the-cut-0123456789abcdef"
    claimed = await executor_harness.claim(LONG_LINE, secrets={"S": secret})
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS
    log = "\n".join(task.log_rows)
    assert secret[10:] not in log
    assert "after the long line" in task.log_rows


KEY_INTO_OUTPUT = """
on: push
jobs:
  outputs:
    runs-on: self-hosted
    steps:
      - env:
          B: ${{ secrets.B }}
        run: echo "$B" >> "$GITHUB_OUTPUT"
"""


async def test_a_secret_written_as_an_output_name_is_masked_in_the_error(executor_harness: ExecutorHarness) -> None:
    """A base64 secret ends in '=': written alone to $GITHUB_OUTPUT it becomes a name over 255 bytes,
    and the error naming it must not show its first characters."""
    key = "".join(f"LS0tLS1CRUdJTi{i:04d}" for i in range(30)) + "=="
    claimed = await executor_harness.claim(KEY_INTO_OUTPUT, secrets={"B": key})
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    log = "\n".join(task.log_rows)
    assert "the limit for an output name is 255 bytes" in log
    assert key[:30] not in log


async def test_an_internal_error_is_masked_in_the_job_log_and_on_stderr(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The executor's own stderr (its traceback) is what the controller shows when the executor
    dies: it is masked with the task's secrets like the job log."""
    from dynrunner.executor import job

    secret = "internal-error-secret-4711"

    async def broken(self: object) -> None:
        raise RuntimeError(f"engine bug while holding {secret}")

    monkeypatch.setattr(job.JobRunner, "run", broken)
    claimed = await executor_harness.claim(TOKEN_INTO_ENV, secrets={"T": secret})
    with caplog.at_level(logging.ERROR, logger="dynrunner.executor"):
        assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert "##[error]The executor failed unexpectedly: RuntimeError: engine bug while holding ***" in task.log_rows
    assert "internal error" in caplog.text
    assert secret not in caplog.text


HUGE_MASK = """
on: push
jobs:
  mask:
    runs-on: self-hosted
    steps:
      - shell: python
        run: |
          import base64
          value = base64.b64encode(bytes(range(256)) * 2048).decode()  # 700 KB on one line
          print("::add-mask::" + value, flush=True)
          print("value=" + value, flush=True)
          print("head=" + value[:300], flush=True)
"""


async def test_a_huge_add_mask_value_is_masked(executor_harness: ExecutorHarness) -> None:
    """A whole base64 file registered with ::add-mask:: (hundreds of KiB, one line) is masked
    without taking the executor down."""
    claimed = await executor_harness.claim(HUGE_MASK)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS
    assert "value=***" in task.log_rows
    assert any(row.startswith("head=AAECAwQF") for row in task.log_rows)  # a part of a value is not the value


INTERNAL_ENV = """
on: push
jobs:
  env:
    runs-on: self-hosted
    steps:
      - run: |
          env | grep '^DYNRUNNER_' | cut -d= -f1 | sort | sed 's/^/internal: /'
"""


async def test_the_executors_own_settings_do_not_reach_steps(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DYNRUNNER_READY_FILE", str(tmp_path / "ready"))
    monkeypatch.setenv("DYNRUNNER_GITEA_REGISTRATION_TOKEN", "registration-token-must-stay-home")
    claimed = await executor_harness.claim(INTERNAL_ENV)
    assert await executor_harness.run(claimed) == 0
    rows = executor_harness.gitea.task(claimed.task_id).log_rows
    assert [row for row in rows if row.startswith("internal: ")] == ["internal: DYNRUNNER_RUNTIME_DIR"]
    assert (tmp_path / "ready").exists()
