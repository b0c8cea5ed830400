"""`dynrunner-executor run --assignment FILE` as the launchers start it."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

from dynrunner.executor import run
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import EXECUTOR_BIN, ExecutorHarness

WORKFLOW = """
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      greeting: ${{ steps.hello.outputs.greeting }}
    steps:
      - id: hello
        run: echo "greeting=hello from the console script" >> "$GITHUB_OUTPUT"
"""


async def test_console_script_runs_and_exits_0(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(WORKFLOW)
    code, stderr = await executor_harness.run_subprocess(claimed)
    assert code == 0, stderr
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS
    assert task.outputs == {"greeting": "hello from the console script"}
    assert "finalized" in stderr


async def test_main_in_process(executor_harness: ExecutorHarness) -> None:
    claimed = await executor_harness.claim(WORKFLOW)
    path = executor_harness.write(claimed.assignment)
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    args = parser.parse_args(["--assignment", str(path)])
    assert await asyncio.to_thread(run.main, args) == 0
    assert executor_harness.gitea.task(claimed.task_id).result == Result.SUCCESS


async def test_missing_or_garbage_assignment_files(executor_harness: ExecutorHarness, tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(EXECUTOR_BIN), "run", "--assignment", str(tmp_path / "missing.pb"), stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 3 and b"cannot read the assignment" in err
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(b"\x0a\xff\xff")
    proc = await asyncio.create_subprocess_exec(
        str(EXECUTOR_BIN), "run", "--assignment", str(garbage), stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 3 and b"cannot be reported" in err
    proc = await asyncio.create_subprocess_exec(str(EXECUTOR_BIN), "run", stderr=asyncio.subprocess.PIPE)
    await proc.communicate()
    assert proc.returncode == 2


async def test_sigterm_stops_the_step_and_reports_the_job_failed(
    executor_harness: ExecutorHarness, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    workflow = f"""
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - shell: python
        run: |
          import os, time
          open("{pid_file}", "w").write(str(os.getpid()))
          print("started", flush=True)
          time.sleep(300)
      - if: always()
        run: echo "nothing runs while shutting down"
"""
    claimed = await executor_harness.claim(workflow)
    path = executor_harness.write(claimed.assignment)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dynrunner.executor.cli",
        "run",
        "--assignment",
        str(path),
        stderr=asyncio.subprocess.PIPE,
    )
    await executor_harness.wait_for_log(claimed.task_id, "started", timeout_s=60)
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert "##[error]The runner's environment is shutting down; the job was stopped." in task.log_rows
    assert "nothing runs while shutting down" not in task.log_rows
    assert gone(int(pid_file.read_text()))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
