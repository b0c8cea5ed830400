"""Stage lines, heartbeats and the one finalize path, against the Gitea double."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dynrunner.controller.finalize import FinalizeOutcome, finalize_failed
from dynrunner.controller.stagelog import Heartbeat, StageLog, TaskEnded
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, LogRow, Result, RunnerCredentials, Task, TaskState

WORKFLOW = """
on: push
jobs:
  build:
    runs-on: [self-hosted]
    steps:
      - run: echo one
      - run: echo two
"""


async def claim(gitea: GiteaDouble) -> tuple[GiteaClient, Task]:
    base = GiteaClient(gitea.url)
    info = await base.register(
        name="t", registration_token=gitea.registration_token, labels=["self-hosted"], ephemeral=True
    )
    client = base.with_credentials(RunnerCredentials(info.uuid, info.token))
    gitea.submit("owner/repo", WORKFLOW)
    result = await client.fetch_task(0)
    assert result.task is not None
    return client, result.task


async def test_stage_lines_land_at_the_servers_ack_index(gitea: GiteaDouble) -> None:
    client, task = await claim(gitea)
    assert await StageLog(client, task.id, next_index=0).write("claimed")
    stage = StageLog(client, task.id, next_index=1)
    assert await stage.write("environment created", "starting")
    assert stage.next_index == 3
    # A guess past the end (an earlier line was lost, the server is behind) is corrected.
    late = StageLog(client, task.id, next_index=10)
    assert await late.write("late")
    assert late.next_index == 4
    assert gitea.task(task.id).log_rows == [
        "[dynrunner] claimed",
        "[dynrunner] environment created",
        "[dynrunner] starting",
        "[dynrunner] late",
    ]


async def test_finalize_failed_writes_the_reason_then_ends_the_task(gitea: GiteaDouble) -> None:
    client, task = await claim(gitea)
    await StageLog(client, task.id).write("claimed")
    outcome = await finalize_failed(client, task.id, "the environment died\nline two")
    assert outcome is FinalizeOutcome.FINALIZED
    view = gitea.task(task.id)
    assert view.status == "failure" and view.stopped > 0
    assert view.log_archived
    assert view.log_rows == [
        "[dynrunner] claimed",
        "[dynrunner] the job failed: the environment died",
        "[dynrunner] line two",
    ]
    # Gitea deleted the ephemeral runner with the final UpdateTask: a second finalize is a no-op.
    assert await finalize_failed(client, task.id, "again") is FinalizeOutcome.RUNNER_GONE
    assert gitea.task(task.id).log_rows[-1] == "[dynrunner] line two"


async def test_finalize_after_the_executor_finished_changes_nothing(gitea: GiteaDouble) -> None:
    client, task = await claim(gitea)
    ack = await client.update_log(task.id, 0, [LogRow(time=datetime.now(UTC), content="x")])
    await client.update_log(task.id, ack, [], no_more=True)
    await client.update_task(TaskState(id=task.id, result=Result.SUCCESS))
    assert await finalize_failed(client, task.id, "too late") is FinalizeOutcome.RUNNER_GONE
    assert gitea.task(task.id).status == "success"


async def test_heartbeat_keeps_the_task_and_notices_a_cancel(gitea: GiteaDouble) -> None:
    client, task = await claim(gitea)
    heartbeat = Heartbeat(client, task.id, interval_s=0.05)
    await heartbeat.beat()
    assert gitea.task(task.id).status == "running"
    [run] = gitea.runs()
    gitea.cancel_run(run.id)
    with pytest.raises(TaskEnded):
        await heartbeat.beat()
    heartbeat.start()
    await heartbeat.stop()
