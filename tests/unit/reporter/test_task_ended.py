"""Gitea ends the task under a running job (issue 10 item 1).

Gitea 1.24-1.26 answer a cancel by ending the task at once and deleting its ephemeral runner:
the reporter's next call is refused "unregistered runner". From then on the job's rows go to
the executor's stderr, masked, the rows Gitea never acknowledged first; closing sends
nothing and counts as done. A passing failure (a front end's 5xx page, Gitea restarting) is
never taken for that, nor is a refusal before the first report (the credentials may be wrong).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest

from dynrunner.executor.reporter import Reporter, ReporterConfig
from dynrunner.proto.gitea import AlreadyExists, ErrorPage, Internal, Result, Unauthenticated, Unavailable
from dynrunner.proto.masking import Masker
from tests.fixtures.executor import UnreportedCapture

SLOW = 60.0


@pytest.fixture
def sink() -> UnreportedCapture:
    return UnreportedCapture()


@pytest.fixture
async def reporter(fake, sink: UnreportedCapture) -> AsyncIterator[Callable[..., Reporter]]:
    made: list[Reporter] = []
    config = ReporterConfig(
        log_interval_s=SLOW,
        log_max_latency_s=SLOW,
        heartbeat_s=SLOW,
        retry_initial_s=0.01,
        retry_max_s=0.05,
        unreported_output=sink,
    )

    def factory(**changes: object) -> Reporter:
        rep = Reporter(fake, fake.task_id, Masker(["s3cr3t"]), replace(config, **changes))
        made.append(rep)
        return rep

    yield factory
    for rep in made:
        await rep._stop_pump()


async def test_runner_deleted_mid_job_sends_the_rest_of_the_log_to_stderr_masked(fake, reporter, sink) -> None:
    rep = reporter(heartbeat_s=0.05)
    await rep.start(2)
    rep.step_started(0)
    rep.log("reported", step=0)
    await asyncio.wait_for(_until(lambda: "reported" in fake.contents), 5)
    fake.runner_deleted = True  # a cancel on Gitea 1.26: the task ended, its runner deleted
    rep.log("on its way when the runner went: s3cr3t", step=0)
    await asyncio.wait_for(rep.cancelled.wait(), 5)
    calls = len(fake.calls)
    assert rep.ended_by_gitea and rep.unreported
    assert isinstance(rep.error, Unauthenticated)
    assert rep.server_result == Result.UNSPECIFIED
    rep.step_finished(0, Result.CANCELLED)
    rep.step_started(1)
    rep.log("cleanup says s3cr3t\nand a second line", step=1)
    rep.set_outputs({"out": "v"})
    assert await rep.close(Result.CANCELLED) is True
    assert len(fake.calls) == calls  # nothing more was sent
    assert "unregistered runner" in sink.text and "Gitea 1.24-1.26 delete the runner" in sink.text
    assert sink.rows(7) == [
        "on its way when the runner went: ***",
        "cleanup says ***",
        "and a second line",
        "Job cancelled",
    ]
    assert "s3cr3t" not in sink.text
    assert "job outputs not reported: out" in sink.text


async def test_runner_deleted_while_a_report_is_in_flight_loses_none_of_its_rows(fake, reporter, sink) -> None:
    rep = reporter(batch_rows=3)
    await rep.start(0)
    fake.delay_s = 0.2
    for i in range(3):
        rep.log(f"row {i}")  # a full batch: sent at once
    await asyncio.wait_for(_until(lambda: len(fake.log_calls()) == 2), 5)
    fake.runner_deleted = True  # while that UpdateLog is on its way
    await asyncio.wait_for(rep.cancelled.wait(), 5)
    assert rep.unreported
    assert fake.contents == []
    assert sink.rows(7) == ["row 0", "row 1", "row 2"]
    assert await rep.close(Result.CANCELLED)


@pytest.mark.parametrize("closing_line", [True, False])
async def test_runner_deleted_after_the_log_was_completed_counts_as_ended(fake, reporter, sink, closing_line) -> None:
    """The cancel lands between the completed log and the final UpdateTask."""
    rep = reporter(closing_line=closing_line)
    await rep.start(0)
    rep.log("all sent")
    update_task = fake.update_task

    async def cancelled_just_before(*args, **kwargs):
        fake.runner_deleted = True
        return await update_task(*args, **kwargs)

    fake.update_task = cancelled_just_before
    assert await rep.close(Result.SUCCESS) is True
    assert rep.unreported
    assert fake.contents[0] == "all sent" and sink.rows(7) == []


async def test_runner_deleted_while_closing_counts_as_ended(fake, reporter, sink) -> None:
    rep = reporter()
    await rep.start(1)
    rep.step_started(0)
    rep.log("last words")
    fake.runner_deleted = True  # the cancel lands just as the job ends
    assert await rep.close(Result.SUCCESS) is True
    assert rep.unreported
    assert sink.rows(7) == ["last words", "Job succeeded"]


@pytest.mark.parametrize("closing_line", [True, False])
async def test_runner_deleted_as_the_log_is_completed_writes_the_closing_row_once(
    fake, reporter, sink, closing_line: bool
) -> None:
    rep = reporter(closing_line=closing_line)
    await rep.start(0)
    rep.log("sent before the end")
    update_log = fake.update_log

    async def cancelled_before_the_last_request(*args, no_more: bool = False, **kwargs):
        if no_more:
            fake.runner_deleted = True
        return await update_log(*args, no_more=no_more, **kwargs)

    fake.update_log = cancelled_before_the_last_request
    assert await rep.close(Result.SUCCESS) is True
    assert fake.contents == ["sent before the end"]
    assert sink.rows(7) == (["Job succeeded"] if closing_line else [])


@pytest.mark.parametrize(
    "refusal",
    [AlreadyExists("log file has been archived"), Internal("update task: resource does not exist")],
    ids=["log-archived-by-a-reaper", "task-gone"],
)
async def test_other_refusals_that_show_the_task_is_over(fake, reporter, sink, refusal) -> None:
    rep = reporter()
    await rep.start(0)
    fake.refusal = refusal
    rep.log("after the end")
    rep.set_outputs({"k": "v"})  # makes a state report due at once
    await asyncio.wait_for(rep.cancelled.wait(), 5)
    assert rep.ended_by_gitea and rep.unreported
    assert await rep.close(Result.CANCELLED) is True
    assert sink.rows(7) == ["after the end", "Job cancelled"]


@pytest.mark.parametrize(
    "passing",
    [
        ErrorPage("HTTP 500 without a Connect error (an error page)"),
        Unavailable("connection refused"),
        Internal("get task: database is locked"),
    ],
    ids=["front-end-5xx-page", "gitea-restarting", "gitea-internal"],
)
async def test_passing_failures_are_not_taken_for_the_end_of_the_task(fake, reporter, sink, passing) -> None:
    rep = reporter(heartbeat_s=0.05)
    await rep.start(0)
    fake.failures = [passing] * 4
    rep.log("kept")
    await asyncio.wait_for(_until(lambda: "kept" in fake.contents), 5)
    assert not rep.cancelled.is_set() and not rep.ended_by_gitea and not rep.unreported
    assert await rep.close(Result.SUCCESS) is True
    assert fake.result == Result.SUCCESS
    assert sink.text == ""


async def test_refused_before_the_first_report_is_a_failure_to_report(fake, reporter, sink) -> None:
    """Credentials Gitea never took may be wrong rather than spent: that stays a failure."""
    rep = reporter()
    fake.runner_deleted = True
    with pytest.raises(Unauthenticated):
        await rep.start(0)
    assert rep.cancelled.is_set() and not rep.ended_by_gitea and not rep.unreported
    assert await rep.close(Result.FAILURE) is False
    assert sink.text == ""


async def _until(cond: Callable[[], object]) -> None:
    while not cond():  # noqa: ASYNC110
        await asyncio.sleep(0.005)
