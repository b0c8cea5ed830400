"""UpdateTask: ownership, steps by index, outputs, finalization, cancellation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, Internal, Result, StepState, TaskState, Unauthenticated
from dynrunner.proto.gitea.client import NO_RETRY
from tests.fixtures.gitea_calls import final_state, job, register, workflow

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
T1 = datetime(2026, 1, 2, 3, 5, 0, tzinfo=UTC)


async def claimed(
    gitea: GiteaDouble, steps: int = 2, *, ephemeral: bool = False, capabilities: tuple[str, ...] = ()
) -> tuple[GiteaClient, int, int]:
    runner = await register(gitea, ephemeral=ephemeral, capabilities=capabilities)
    run = gitea.submit("owner/repo", workflow(job("build", steps=steps)))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    return runner, fetched.task.id, run.id


async def test_another_runners_task_is_an_internal_error(gitea: GiteaDouble) -> None:
    _, task_id, _ = await claimed(gitea)
    intruder = await register(gitea, name="intruder")
    with pytest.raises(Internal) as caught:
        await intruder.update_task(TaskState(id=task_id), retry=NO_RETRY)
    assert caught.value.wire == "rpc error: code = Internal desc = update task: invalid runner for task"
    assert not caught.value.transient


async def test_an_unknown_task_is_an_internal_error(gitea: GiteaDouble) -> None:
    runner, _, _ = await claimed(gitea)
    with pytest.raises(Internal) as caught:
        await runner.update_task(TaskState(id=999), retry=NO_RETRY)
    assert caught.value.wire == "rpc error: code = Internal desc = update task: resource does not exist"
    assert not caught.value.transient


async def test_steps_are_updated_by_index(gitea: GiteaDouble) -> None:
    runner, task_id, _ = await claimed(gitea, steps=3)
    result = await runner.update_task(
        TaskState(
            id=task_id,
            steps=[
                StepState(id=0, result=Result.SUCCESS, started_at=T0, stopped_at=T1, log_index=0, log_length=4),
                StepState(id=1, started_at=T1, log_index=4, log_length=2),
                StepState(id=7, result=Result.FAILURE),  # no such step: ignored
            ],
        )
    )
    assert result.result is Result.UNSPECIFIED
    steps = gitea.task(task_id).steps
    assert [(s.status, s.log_index, s.log_length) for s in steps] == [
        ("success", 0, 4),
        ("running", 4, 2),
        ("waiting", 0, 0),
    ]
    assert (steps[0].started, steps[0].stopped) == (int(T0.timestamp()), int(T1.timestamp()))
    assert (steps[1].started, steps[1].stopped) == (int(T1.timestamp()), 0)


async def test_a_step_left_out_regresses_to_running(gitea: GiteaDouble) -> None:
    """Gitea recomputes every step's status; one absent from the request keeps its fields,
    so a finished step with a start time goes back to `running`."""
    runner, task_id, _ = await claimed(gitea)
    await runner.update_task(
        TaskState(id=task_id, steps=[StepState(id=0, result=Result.SUCCESS, started_at=T0, stopped_at=T1)])
    )
    await runner.update_task(TaskState(id=task_id, steps=[StepState(id=1, started_at=T1)]))
    first = gitea.task(task_id).steps[0]
    assert (first.status, first.started, first.stopped) == ("running", int(T0.timestamp()), int(T1.timestamp()))


async def test_zero_fields_of_a_reported_step_keep_the_stored_values(gitea: GiteaDouble) -> None:
    """Gitea writes a step with xorm's `Update(step)`, which skips zero fields: a step
    reported again without times, log index/length or result keeps what it had."""
    runner, task_id, _ = await claimed(gitea)
    await runner.update_task(
        TaskState(
            id=task_id,
            steps=[
                StepState(id=0, result=Result.SUCCESS, started_at=T0, stopped_at=T1, log_index=0, log_length=5),
                StepState(id=1, started_at=T1, log_index=5, log_length=3),
            ],
        )
    )
    await runner.update_task(TaskState(id=task_id, steps=[StepState(id=0, result=Result.SUCCESS), StepState(id=1)]))
    steps = gitea.task(task_id).steps
    assert [(s.status, s.started, s.stopped, s.log_index, s.log_length) for s in steps] == [
        ("success", int(T0.timestamp()), int(T1.timestamp()), 0, 5),
        ("running", int(T1.timestamp()), 0, 5, 3),
    ]


async def test_a_heartbeat_refreshes_the_task(gitea: GiteaDouble) -> None:
    runner, task_id, _ = await claimed(gitea)
    before = gitea.task(task_id).updated
    gitea.advance_clock(30)
    await runner.update_task(TaskState(id=task_id))
    assert gitea.task(task_id).updated >= before + 30


async def test_outputs_first_write_wins_within_limits_and_all_keys_are_acknowledged(gitea: GiteaDouble) -> None:
    runner, task_id, _ = await claimed(gitea)
    first = await runner.update_task(
        TaskState(id=task_id), {"a": "1", "k" * 256: "too long key", "big": "x" * (1 << 20 | 1)}
    )
    assert first.sent_outputs == {"a"}
    second = await runner.update_task(
        TaskState(id=task_id), {"a": "changed", "b": "2", "k" * 255: "ok", "max": "y" * (1 << 20)}
    )
    assert second.sent_outputs == {"a", "b", "k" * 255, "max"}
    outputs = gitea.task(task_id).outputs
    assert outputs["a"] == "1"
    assert "big" not in outputs and len(outputs["max"]) == 1 << 20


async def test_output_limits_count_bytes_not_characters(gitea: GiteaDouble) -> None:
    runner, task_id, _ = await claimed(gitea)
    result = await runner.update_task(TaskState(id=task_id), {"é" * 128: "two bytes each", "é" * 127: "fits"})
    assert result.sent_outputs == {"é" * 127}


async def test_a_final_result_finalizes_task_and_job_with_the_runners_stop_time(gitea: GiteaDouble) -> None:
    runner, task_id, run_id = await claimed(gitea)
    result = await runner.update_task(
        TaskState(id=task_id, result=Result.FAILURE, started_at=T0, stopped_at=T1, steps=[])
    )
    assert result.result is Result.FAILURE
    task = gitea.task(task_id)
    assert (task.status, task.stopped) == ("failure", int(T1.timestamp()))
    [finished] = gitea.jobs(run_id)
    assert (finished.status, finished.stopped) == ("failure", int(T1.timestamp()))
    assert gitea.run(run_id).status == "failure"


async def test_a_final_result_without_stop_time_stops_at_epoch(gitea: GiteaDouble) -> None:
    runner, task_id, _ = await claimed(gitea)
    await runner.update_task(TaskState(id=task_id, result=Result.SUCCESS))
    assert gitea.task(task_id).stopped == 0


async def test_a_finished_task_does_not_change_again(gitea: GiteaDouble) -> None:
    runner, task_id, _ = await claimed(gitea)
    await runner.update_task(final_state(task_id, Result.SUCCESS, steps=2))
    again = await runner.update_task(
        TaskState(id=task_id, result=Result.FAILURE, steps=[StepState(id=0, result=Result.FAILURE)]),
        {"late": "still stored"},
    )
    assert again.result is Result.SUCCESS
    task = gitea.task(task_id)
    assert task.status == "success" and task.steps[0].status == "success"
    assert task.outputs == {"late": "still stored"}  # outputs are stored whatever the state


async def test_the_response_echoes_the_request_id_and_the_tasks_result(gitea: GiteaDouble) -> None:
    runner, task_id, _ = await claimed(gitea)
    result = await runner.update_task(final_state(task_id, Result.SKIPPED))
    assert result.result is Result.SKIPPED


async def test_cancelling_a_run_surfaces_as_result_cancelled(gitea: GiteaDouble) -> None:
    runner, task_id, run_id = await claimed(gitea)
    await runner.update_task(TaskState(id=task_id, steps=[StepState(id=0, started_at=T0)]))
    gitea.cancel_run(run_id)
    task = gitea.task(task_id)
    assert task.status == "cancelled"
    assert [s.status for s in task.steps] == ["cancelled", "cancelled"]  # unfinished steps are stopped too
    assert task.steps[1].started > 0  # a step that never started gets a start time
    response = await runner.update_task(TaskState(id=task_id))
    assert response.result is Result.CANCELLED
    final = await runner.update_task(final_state(task_id, Result.SUCCESS))
    assert final.result is Result.CANCELLED  # already final: the runner's result is ignored
    assert gitea.run(run_id).status == "cancelled"


async def test_a_cancelling_capable_runner_sees_cancelling_until_it_reports(gitea: GiteaDouble) -> None:
    runner, task_id, run_id = await claimed(gitea, capabilities=("cancelling",))
    gitea.cancel_run(run_id)
    assert gitea.task(task_id).status == "cancelling"
    assert gitea.jobs(run_id)[0].status == "cancelling"
    assert gitea.run(run_id).status == "cancelling"
    assert (await runner.update_task(TaskState(id=task_id))).result is Result.CANCELLED
    final = await runner.update_task(final_state(task_id, Result.SUCCESS))  # post steps ran fine
    assert final.result is Result.CANCELLED
    assert gitea.task(task_id).status == "cancelled"


async def test_cancelling_a_run_cancels_its_waiting_and_blocked_jobs(gitea: GiteaDouble) -> None:
    run = gitea.submit("owner/repo", workflow(job("build"), job("test", extra="needs: build")))
    gitea.cancel_run(run.id)
    assert [j.status for j in gitea.jobs(run.id)] == ["cancelled", "cancelled"]
    assert gitea.run(run.id).status == "cancelled"


async def test_an_ephemeral_runner_cancelled_without_the_capability_is_deleted(gitea: GiteaDouble) -> None:
    """StopTask finalizes the task, and finalizing deletes an ephemeral runner: without the
    `cancelling` capability the runner learns nothing but "unregistered runner"."""
    runner, task_id, run_id = await claimed(gitea, ephemeral=True)
    gitea.cancel_run(run_id)
    with pytest.raises(Unauthenticated):
        await runner.update_task(TaskState(id=task_id))
    assert gitea.runners() == []
