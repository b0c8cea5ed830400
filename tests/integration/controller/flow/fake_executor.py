"""A tiny stand-in for `dynrunner-executor run`, for the controller's flow tests.

It reads the assignment the local backend wrote, and behaves as the job's `env.FAKE_EXECUTOR`
says: `succeed` (default: log a line and finalize the task as success with the claiming
runner's credentials), `crash` (exit 3 without finalizing), `hang` (sleep until killed), or
`sleep:<seconds>` (then succeed). Each start appends `<assignment id> <task id>` to `starts.log`
next to the environments' root, so tests can count executions.

    python fake_executor.py run --assignment FILE
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from dynrunner.proto.assignment import decode
from dynrunner.proto.gitea import GiteaClient, LogRow, Result, RunnerCredentials, TaskState


def behaviour(payload: bytes | None) -> str:
    doc = yaml.safe_load(payload or b"") or {}
    job = next(iter((doc.get("jobs") or {}).values()), {}) or {}
    return str((job.get("env") or {}).get("FAKE_EXECUTOR", "succeed"))


async def finalize(data: bytes) -> None:
    a = decode(data)
    client = GiteaClient(a.gitea_url, RunnerCredentials(a.runner.uuid, a.runner.token))
    now = datetime.now(UTC)
    ack = await client.update_log(a.task.id, 0, [])
    rows = [LogRow(now, f"fake executor ran job {a.job_key} in {Path.cwd()}")]
    await client.update_log(a.task.id, ack, rows, no_more=True)
    await client.update_task(TaskState(id=a.task.id, result=Result.SUCCESS, started_at=now, stopped_at=now))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("--assignment", type=Path, required=True)
    args = parser.parse_args()
    a = decode(args.assignment.read_bytes())
    root = args.assignment.parent.parent
    with (root.parent / "starts.log").open("a") as f:
        f.write(f"{a.assignment_id} {a.task.id}\n")
    what = behaviour(a.task.workflow_payload)
    if what == "crash":
        print("fake executor: crashing on purpose", file=sys.stderr)
        return 3
    if what == "hang":
        while True:
            time.sleep(1)
    if what.startswith("sleep:"):
        time.sleep(float(what.split(":", 1)[1]))
    asyncio.run(finalize(args.assignment.read_bytes()))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: pyqwest's runtime sometimes aborts there (SIGABRT after the
    # task was finalized), which would blur what these tests check.
    os._exit(code)
