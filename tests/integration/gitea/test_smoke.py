"""The minimal slice: register, declare, claim, report, and read the state back."""

from __future__ import annotations

from datetime import UTC, datetime

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, LogRow, Result, RunnerCredentials, StepState, TaskState

WORKFLOW = """
name: ci
on: push
jobs:
  build:
    runs-on: [self-hosted, pod]
    steps:
      - run: echo hi
"""


async def test_claim_report_and_read_back(gitea: GiteaDouble) -> None:
    client = GiteaClient(gitea.url)
    info = await client.register(name="r1", registration_token=gitea.registration_token, labels=["self-hosted", "pod"])
    runner = client.with_credentials(RunnerCredentials(info.uuid, info.token))
    await runner.declare(labels=["self-hosted", "pod"])
    run = gitea.submit("owner/repo", WORKFLOW)

    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    now = datetime.now(UTC)
    assert await runner.update_log(fetched.task.id, 0, [LogRow(now, "hello")], no_more=True) == 1
    result = await runner.update_task(
        TaskState(
            id=fetched.task.id,
            result=Result.SUCCESS,
            stopped_at=now,
            steps=[StepState(id=0, result=Result.SUCCESS, started_at=now, stopped_at=now, log_length=1)],
        ),
        {"greeting": "hi"},
    )

    assert result.result is Result.SUCCESS
    assert result.sent_outputs == {"greeting"}
    task = gitea.task(fetched.task.id)
    assert task.status == "success"
    assert task.log_rows == ["hello"]
    assert task.log_archived
    assert task.outputs == {"greeting": "hi"}
    assert [s.status for s in task.steps] == ["success"]
    assert (await gitea.wait_run(run.id, timeout_s=5)).status == "success"
