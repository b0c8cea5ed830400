"""UpdateLog: Gitea's ack arithmetic, archiving, and row storage."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import AlreadyExists, GiteaClient, Internal, LogRow
from dynrunner.proto.gitea.client import NO_RETRY
from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.gitea_calls import job, register, workflow

STAMP = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


def rows(*contents: str) -> list[LogRow]:
    return [LogRow(STAMP, c) for c in contents]


async def claimed(gitea: GiteaDouble) -> tuple[GiteaClient, int]:
    runner = await register(gitea)
    gitea.submit("owner/repo", workflow(job("build")))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    return runner, fetched.task.id


async def test_rows_are_appended_and_acknowledged(gitea: GiteaDouble) -> None:
    runner, task_id = await claimed(gitea)
    assert await runner.update_log(task_id, 0, rows("a", "b")) == 2
    assert await runner.update_log(task_id, 2, rows("c")) == 3
    assert gitea.task(task_id).log_rows == ["a", "b", "c"]


async def test_already_acknowledged_rows_are_ignored(gitea: GiteaDouble) -> None:
    runner, task_id = await claimed(gitea)
    await runner.update_log(task_id, 0, rows("a", "b"))
    assert await runner.update_log(task_id, 0, rows("a", "b")) == 2  # pure duplicate
    assert await runner.update_log(task_id, 1, rows("b", "c", "d")) == 4  # overlap: only the new tail
    assert gitea.task(task_id).log_rows == ["a", "b", "c", "d"]


async def test_a_runner_ahead_of_the_server_gets_the_lower_ack_and_resends(gitea: GiteaDouble) -> None:
    runner, task_id = await claimed(gitea)
    await runner.update_log(task_id, 0, rows("a"))
    assert await runner.update_log(task_id, 3, rows("d", "e")) == 1  # rows 1..2 never arrived
    assert gitea.task(task_id).log_rows == ["a"]
    assert await runner.update_log(task_id, 1, rows("b", "c", "d", "e")) == 5  # resend from the ack
    assert gitea.task(task_id).log_rows == ["a", "b", "c", "d", "e"]


async def test_no_more_archives_and_later_rows_are_rejected(gitea: GiteaDouble) -> None:
    runner, task_id = await claimed(gitea)
    assert await runner.update_log(task_id, 0, rows("a"), no_more=True) == 1
    assert gitea.task(task_id).log_archived
    with pytest.raises(AlreadyExists) as caught:
        await runner.update_log(task_id, 1, rows("late"), retry=NO_RETRY)
    assert caught.value.wire == "rpc error: code = AlreadyExists desc = log file has been archived"
    assert await runner.update_log(task_id, 0, rows("a"), no_more=True) == 1  # a resent finalize is fine
    assert await runner.update_log(task_id, 1, [], no_more=True) == 1
    assert gitea.task(task_id).log_rows == ["a"]


async def test_an_empty_no_more_finalizes(gitea: GiteaDouble) -> None:
    runner, task_id = await claimed(gitea)
    await runner.update_log(task_id, 0, rows("a"))
    assert await runner.update_log(task_id, 1, [], no_more=True) == 1
    assert gitea.task(task_id).log_archived


async def test_an_empty_no_more_on_an_empty_log_archives_an_empty_file(gitea: GiteaDouble) -> None:
    runner, task_id = await claimed(gitea)
    assert await runner.update_log(task_id, 0, [], no_more=True) == 0
    task = gitea.task(task_id)
    assert task.log_archived and task.log_rows == []


async def test_no_more_from_a_runner_ahead_does_not_archive(gitea: GiteaDouble) -> None:
    runner, task_id = await claimed(gitea)
    await runner.update_log(task_id, 0, rows("a"))
    assert await runner.update_log(task_id, 5, [], no_more=True) == 1
    assert not gitea.task(task_id).log_archived


async def test_before_37631_an_empty_no_more_did_not_finalize(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(legacy_empty_no_more=True) as gitea:
        runner, task_id = await claimed(gitea)
        await runner.update_log(task_id, 0, rows("a"))
        assert await runner.update_log(task_id, 1, [], no_more=True) == 1
        assert not gitea.task(task_id).log_archived
        # act_runner's workaround: an empty sentinel row with no_more
        assert await runner.update_log(task_id, 1, rows(""), no_more=True) == 2
        assert gitea.task(task_id).log_archived


async def test_rows_are_stored_in_gitea_format(gitea: GiteaDouble) -> None:
    runner, task_id = await claimed(gitea)
    await runner.update_log(task_id, 0, rows("two\nlines", "x" * 70_000, "ü" * 40_000))
    task = gitea.task(task_id)
    assert task.log_rows[0] == "two\\nlines"
    assert task.log_rows[1] == "x" * 65_536
    assert len(task.log_rows[2].encode("utf-8", "replace")) <= 65_536 + 3
    assert task.log_times == ["2026-05-06T07:08:09.1234560Z"] * 3
    assert task.log_length == 3


async def test_another_runners_task_is_refused(gitea: GiteaDouble) -> None:
    _, task_id = await claimed(gitea)
    intruder = await register(gitea, name="intruder")
    with pytest.raises(Internal) as caught:
        await intruder.update_log(task_id, 0, rows("x"), retry=NO_RETRY)
    assert caught.value.wire == "rpc error: code = Internal desc = invalid runner for task"
    assert not caught.value.transient


async def test_an_unknown_task_is_refused(gitea: GiteaDouble) -> None:
    runner, _ = await claimed(gitea)
    with pytest.raises(Internal) as caught:
        await runner.update_log(4242, 0, rows("x"), retry=NO_RETRY)
    assert caught.value.wire == "rpc error: code = Internal desc = get task: task with id 4242: resource does not exist"
    assert not caught.value.transient


async def test_appending_rows_refreshes_the_zombie_clock_but_an_empty_call_does_not(gitea: GiteaDouble) -> None:
    runner, task_id = await claimed(gitea)
    start = gitea.task(task_id).updated
    gitea.advance_clock(100)
    await runner.update_log(task_id, 0, [])
    assert gitea.task(task_id).updated == start
    await runner.update_log(task_id, 0, rows("a"))
    assert gitea.task(task_id).updated >= start + 100
