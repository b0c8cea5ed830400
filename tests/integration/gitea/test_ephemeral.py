"""Ephemeral runners: one task, deleted by the final UpdateTask."""

from __future__ import annotations

import asyncio

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import Internal, LogRow, Result, RunnerRemoved, TaskState, Unauthenticated
from dynrunner.proto.gitea.client import NO_RETRY
from tests.fixtures.gitea_calls import final_state, job, now, register, workflow


async def test_the_ephemeral_lifecycle(gitea: GiteaDouble) -> None:
    runner = await register(gitea, ephemeral=True)
    run = gitea.submit("owner/repo", workflow(job("one"), job("two")))
    claimed = await runner.fetch_task(0)
    assert claimed.task is not None

    # spent: while its task runs it gets nothing more, although "two" waits
    assert (await runner.fetch_task(0)).task is None

    # report: logs with no_more first, then the final state (as act_runner's Close does)
    assert await runner.update_log(claimed.task.id, 0, [LogRow(now(), "done")], no_more=True) == 1
    result = await runner.update_task(final_state(claimed.task.id, Result.SUCCESS))
    assert result.result is Result.SUCCESS

    # the final UpdateTask deleted the runner: every later call is unauthenticated
    assert gitea.runners() == []
    [deleted] = gitea.runners(include_deleted=True)
    assert deleted.deleted
    with pytest.raises(Unauthenticated):
        await runner.fetch_task(0)
    with pytest.raises(Unauthenticated):
        await runner.update_task(TaskState(id=claimed.task.id), retry=NO_RETRY)
    with pytest.raises(Unauthenticated):
        await runner.update_log(claimed.task.id, 1, [], no_more=True, retry=NO_RETRY)
    assert [j.status for j in gitea.jobs(run.id)] == ["success", "waiting"]


async def test_a_fetch_racing_the_final_update_sees_runner_has_been_removed(gitea: GiteaDouble) -> None:
    """A FetchTask that reloaded the runner just before the final UpdateTask deleted it finds
    the runner's task finished, deletes the runner and answers "runner has been removed"."""
    runner = await register(gitea, ephemeral=True)
    gitea.submit("owner/repo", workflow(job("one"), job("two")))
    claimed = await runner.fetch_task(0)
    assert claimed.task is not None
    gitea.hooks.pick_pause_s = 0.3
    racing = asyncio.ensure_future(runner.fetch_task(0))
    await asyncio.sleep(0.1)  # authenticated and reloaded, paused before the pick
    await runner.update_task(final_state(claimed.task.id))
    with pytest.raises(RunnerRemoved) as caught:
        await racing
    assert caught.value.wire == "rpc error: code = Internal desc = pick task: runner has been removed"
    assert not caught.value.transient


async def test_a_fetch_racing_earlier_fails_to_reload_the_runner(gitea: GiteaDouble) -> None:
    """Deleted between the interceptor and FetchTask's reload: Gitea's "get runner" error."""
    runner = await register(gitea, ephemeral=True)
    gitea.submit("owner/repo", workflow(job("one")))
    claimed = await runner.fetch_task(0)
    assert claimed.task is not None and runner.credentials is not None
    gitea.hooks.fetch_pause_s = 0.3
    racing = asyncio.ensure_future(runner.fetch_task(0))
    await asyncio.sleep(0.1)
    await runner.update_task(final_state(claimed.task.id))
    with pytest.raises(Internal) as caught:
        await racing
    uuid = runner.credentials.uuid
    assert (
        caught.value.wire
        == f"rpc error: code = Internal desc = get runner: runner with uuid {uuid}: resource does not exist"
    )
    assert not caught.value.transient  # the runner is gone: retrying FetchTask with it cannot help


async def test_an_unused_ephemeral_runner_stays_registered(gitea: GiteaDouble) -> None:
    runner = await register(gitea, ephemeral=True)
    for _ in range(3):
        assert (await runner.fetch_task(0)).task is None
    assert [r.ephemeral for r in gitea.runners()] == [True]


async def test_a_released_claim_leaves_the_ephemeral_runner_armed(gitea: GiteaDouble) -> None:
    runner = await register(gitea, ephemeral=True)
    run = gitea.submit("owner/repo", workflow(job("one")))
    gitea.hooks.build_delay_s = 0.4
    with pytest.raises(Exception):  # noqa: B017 - the client times out; which error does not matter
        await runner.fetch_task(0, timeout_s=0.1)
    await asyncio.sleep(0.5)
    gitea.hooks.build_delay_s = 0
    again = await runner.fetch_task(0)
    assert again.task is not None  # the released task row is gone, so the runner may claim again
    assert gitea.jobs(run.id)[0].task_id == again.task.id
