"""Stage lines, heartbeats and the one finalize path, against the Gitea double."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.reporting.finalize import FinalizeOutcome, final_steps, finalize_failed
from dynrunner.controller.reporting.stagelog import (
    CLAIMED_LINE_DELAY_S,
    CLAIMED_LINE_RETRY_S,
    LAST_STAGE_RETRY,
    ClaimLine,
    Heartbeat,
    StageLog,
    TaskEnded,
)
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, LogRow, Result, RunnerCredentials, StepState, Task, TaskState
from tests.fixtures.faults import fault_proxy
from tests.fixtures.gitea_inprocess import InProcessGitea
from tests.fixtures.virtual_time import virtual_time

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


async def test_stage_lines_stop_once_rows_of_another_writer_lie_past_them(gitea: GiteaDouble) -> None:
    """The executor took over: a stage line appended at the log's end would take the index of
    its next row (seen under load: "image … already present" in place of "Workload identity …
    issued"), so the stage log writes nothing more."""
    client, task = await claim(gitea)
    stage = StageLog(client, task.id, next_index=0)
    assert await stage.write("claimed")
    assert await client.update_log(task.id, 1, [LogRow(datetime.now(UTC), f"executor {n}") for n in (1, 2)]) == 3
    assert not await stage.write("image already present")
    assert not await stage.write("pod scheduled")
    assert await client.update_log(task.id, 3, [LogRow(datetime.now(UTC), "executor 3")]) == 4
    assert gitea.task(task.id).log_rows == ["[dynrunner] claimed", "executor 1", "executor 2", "executor 3"]


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


async def test_a_runner_an_admin_deleted_leaves_its_task_running_and_says_so(
    gitea: GiteaDouble, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 10 item 10: "runner gone" is not "task ended". Nothing can finalize the task;
    Gitea's zombie reaper fails it once it has heard nothing for its timeout."""
    client, task = await claim(gitea)
    [runner] = [r for r in gitea.runners() if r.uuid == client.credentials.uuid]
    gitea.delete_runner(runner.id)  # an admin, in Site Administration → Runners
    assert await finalize_failed(client, task.id, "the environment died") is FinalizeOutcome.RUNNER_GONE
    assert gitea.task(task.id).status == "running"
    assert f"task {task.id} not finalized: its runner no longer exists" in caplog.text
    assert "finalized as failed" not in caplog.text
    gitea.advance_clock(15 * 60)
    assert gitea.reap_zombies() == [task.id]
    assert gitea.task(task.id).status == "failure"


async def test_a_finalize_gives_every_step_a_final_state(gitea: GiteaDouble) -> None:
    """What the executor reported stays; the step it ran is cancelled (issue 10 item 6)."""
    client, task = await claim(gitea)
    now = datetime.now(UTC).replace(microsecond=0)
    ack = await client.update_log(task.id, 0, [LogRow(time=now, content="one")])
    reported = [StepState(0, Result.SUCCESS, now, now, 0, ack), StepState(1, Result.UNSPECIFIED, now, None, ack, 0)]
    await client.update_task(TaskState(id=task.id, steps=reported))
    assert [s.status for s in gitea.task(task.id).steps] == ["success", "running"]
    steps = final_steps(2, reported, now)
    assert await finalize_failed(client, task.id, "killed", steps) is FinalizeOutcome.FINALIZED
    view = gitea.task(task.id)
    assert [(s.status, s.log_index, s.log_length) for s in view.steps] == [("success", 0, 1), ("cancelled", 1, 0)]
    assert view.steps[1].started > 0 and view.steps[1].stopped >= view.steps[1].started


async def test_a_finalize_cuts_step_ranges_at_the_rows_gitea_has(gitea: GiteaDouble) -> None:
    """An executor that died reported its first step over rows Gitea never received; the
    controller's closing lines land there, and must not read as that step's output."""
    client, task = await claim(gitea)
    now = datetime.now(UTC).replace(microsecond=0)
    ack = await client.update_log(task.id, 0, [LogRow(time=now, content="built")])
    reported = [StepState(0, Result.SUCCESS, now, now, 0, ack + 2), StepState(1, Result.UNSPECIFIED, now, None, 3, 0)]
    assert await finalize_failed(client, task.id, "killed", final_steps(2, reported, now)) is FinalizeOutcome.FINALIZED
    view = gitea.task(task.id)
    assert view.log_rows[0] == "built" and view.log_rows[1].startswith("[dynrunner] the job failed")
    assert [(s.status, s.log_index, s.log_length) for s in view.steps] == [("success", 0, 1), ("cancelled", 1, 0)]


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


class CountingClient(GiteaClient):
    """Counts UpdateLog calls (what each costs Gitea)."""

    calls = 0

    async def update_log(self, *args: object, **kwargs: object) -> int:  # type: ignore[override]
        type(self).calls += 1
        return await super().update_log(*args, **kwargs)  # type: ignore[arg-type]


async def counting_claim(gitea: GiteaDouble) -> tuple[GiteaClient, Task]:
    client, task = await claim(gitea)
    assert client.credentials is not None
    CountingClient.calls = 0
    return CountingClient(gitea.url, client.credentials), task


async def test_the_launchers_first_line_takes_the_claim_line_along(gitea: GiteaDouble) -> None:
    client, task = await counting_claim(gitea)
    claimed_at = datetime.now(UTC)
    line = ClaimLine(client, task.id, "claimed", claimed_at, delay_s=30)
    taken = await line.take()
    assert len(taken) == 1 and not line.held
    assert await StageLog(client, task.id, next_index=0).write("environment created", before=taken)
    assert CountingClient.calls == 1  # one UpdateLog for both lines
    view = gitea.task(task.id)
    assert view.log_rows == ["[dynrunner] claimed", "[dynrunner] environment created"]
    assert taken[0].time == claimed_at  # the claim's own time
    assert await line.take() == []


async def test_a_claim_line_nobody_takes_is_written_alone(gitea: GiteaDouble) -> None:
    client, task = await counting_claim(gitea)
    line = ClaimLine(client, task.id, "claimed", datetime.now(UTC), delay_s=0.01)
    for _ in range(200):
        if gitea.task(task.id).log_rows:
            break
        await asyncio.sleep(0.01)
    assert await line.take() == []  # written (or being written: take waits for it)
    assert await StageLog(client, task.id, next_index=1).write("environment created")
    assert gitea.task(task.id).log_rows == ["[dynrunner] claimed", "[dynrunner] environment created"]
    assert CountingClient.calls == 2


async def test_take_waits_for_a_claim_line_being_written(gitea: GiteaDouble) -> None:
    """The two writers of one launch never race for index 0: a take during the timer's write waits for it."""
    client, task = await claim(gitea)
    assert client.credentials is not None

    class SlowClient(GiteaClient):
        async def update_log(self, *args: object, **kwargs: object) -> int:  # type: ignore[override]
            await asyncio.sleep(0.2)
            return await super().update_log(*args, **kwargs)  # type: ignore[arg-type]

    line = ClaimLine(SlowClient(gitea.url, client.credentials), task.id, "claimed", datetime.now(UTC), delay_s=0)
    await asyncio.sleep(0.05)  # the timer fired; its write is in flight
    assert gitea.task(task.id).log_rows == []
    assert await line.take() == []
    assert gitea.task(task.id).log_rows == ["[dynrunner] claimed"]


async def test_a_claim_line_goes_to_the_start_of_the_log_or_nowhere(gitea: GiteaDouble) -> None:
    """Written alone (its launch finalizes the task, or no line came in time), the claim line
    goes to index 0 only: a log that holds rows already holds it (an earlier attempt of the
    launch wrote it), and it is never appended after them, among another writer's rows."""
    client, task = await claim(gitea)
    claimed_at = datetime.now(UTC)
    first = ClaimLine(client, task.id, "claimed", claimed_at, delay_s=30)
    await first.write()  # e.g. before the launcher finalizes the task
    assert gitea.task(task.id).log_rows == ["[dynrunner] claimed"]
    assert await StageLog(client, task.id, next_index=1).write("environment created")
    again = ClaimLine(client, task.id, "claimed", claimed_at, delay_s=0)  # a later attempt's, written alone
    await asyncio.sleep(0.05)
    await again.write()
    await again.aclose()
    assert gitea.task(task.id).log_rows == ["[dynrunner] claimed", "[dynrunner] environment created"]


async def test_a_claim_line_gitea_did_not_take_is_taken_along_by_the_launcher(gitea: GiteaDouble) -> None:
    """Gitea down when the held-back line is written alone: the line is kept, and the
    launcher's write (which waits out a short outage) puts both at index 0."""
    client, task = await claim(gitea)
    assert client.credentials is not None
    async with fault_proxy(gitea.url) as proxy:
        via_proxy = GiteaClient(proxy.url, client.credentials)
        await proxy.down()
        line = ClaimLine(via_proxy, task.id, "claimed", datetime.now(UTC), delay_s=0)
        await asyncio.sleep(0)  # the timer fires; its write fails after STAGE_RETRY
        taken = await line.take()
        assert [r.content for r in taken] == ["[dynrunner] claimed"]
        assert gitea.task(task.id).log_rows == []
        stage = StageLog(via_proxy, task.id, next_index=0)
        writing = asyncio.create_task(stage.write("environment created", before=taken, retry=LAST_STAGE_RETRY))
        await asyncio.sleep(0.3)
        await proxy.up()
        assert await writing
    assert gitea.task(task.id).log_rows == ["[dynrunner] claimed", "[dynrunner] environment created"]


def test_a_claim_line_gitea_did_not_take_is_retried_until_its_launch_lets_go(tmp_path: Path) -> None:
    """Gitea down when a slow launch's claim line was due: it is tried again every
    `CLAIMED_LINE_RETRY_S` and written once Gitea is back; a launch that let go of its line
    meanwhile (its executor may start, or another replica resumes the launch) writes
    nothing more. Virtual time."""

    async def scenario() -> tuple[list[str], list[str], bool]:
        gitea = InProcessGitea(double, asyncio.get_running_loop())
        base = gitea.client()
        tasks: list[tuple[Any, int]] = []
        for name in ("slow", "let-go"):
            info = await base.register(
                name=name, registration_token=double.registration_token, labels=["self-hosted"], ephemeral=True
            )
            client = base.with_credentials(RunnerCredentials(info.uuid, info.token))
            double.submit("owner/repo", WORKFLOW)
            task = (await client.fetch_task(0)).task
            assert task is not None
            tasks.append((client, task.id))
        gitea.outage(120.0)
        (slow_client, slow), (let_go_client, let_go) = tasks
        slow_line = ClaimLine(slow_client, slow, "claimed", datetime.now(UTC))
        let_go_line = ClaimLine(let_go_client, let_go, "claimed", datetime.now(UTC))
        await asyncio.sleep(CLAIMED_LINE_DELAY_S + 0.1)
        held_during_outage = slow_line.held and let_go_line.held
        await let_go_line.aclose()
        await asyncio.sleep(120.0 + CLAIMED_LINE_RETRY_S)
        return double.task(slow).log_rows, double.task(let_go).log_rows, held_during_outage

    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1)
    try:
        with virtual_time() as runner:
            slow_rows, let_go_rows, held_during_outage = runner.run(scenario())
    finally:
        double.close()
    assert held_during_outage
    assert slow_rows == ["[dynrunner] claimed"]
    assert let_go_rows == []
