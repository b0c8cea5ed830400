"""The in-process stand-in (`tests/fixtures/gitea_inprocess.py`) answers as the double does
over HTTP: one scenario — a refused token, registering, the tasks_version fast path, a claim,
the spent runner, reporting, the deleted runner — replayed against both, every answer compared."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, GiteaError, LogRow, Result, RunnerCredentials, TaskState
from dynrunner.proto.gitea.client import NO_RETRY
from tests.fixtures.gitea_calls import final_state, job, now, workflow
from tests.fixtures.gitea_inprocess import InProcessGitea


async def answer(call: Callable[[], Awaitable[Any]]) -> Any:
    """What a call came back with, comparable across the two (no URLs, no secrets' values)."""
    try:
        result = await call()
    except GiteaError as err:
        return (type(err).__name__, err.code, err.message)
    if hasattr(result, "tasks_version"):
        task = result.task
        return (
            "fetch",
            result.tasks_version,
            None if task is None else (task.id, task.context_get("job"), sorted(task.secrets)),
        )
    if hasattr(result, "uuid"):
        return ("runner", result.id, result.name, list(result.labels), result.ephemeral)
    if hasattr(result, "sent_outputs"):
        return ("state", result.result, sorted(result.sent_outputs))
    return result


async def scenario(gitea: GiteaDouble, client: Any) -> list[Any]:
    answers = [await answer(lambda: client.ping("x"))]
    register = lambda token: client.register(  # noqa: E731
        name="r", registration_token=token, labels=["self-hosted", "local"], ephemeral=True
    )
    answers.append(await answer(lambda: register("not-the-token")))
    info = await register(gitea.registration_token)
    answers.append(await answer(lambda: register(gitea.registration_token)))  # a second runner
    runner = client.with_credentials(RunnerCredentials(info.uuid, info.token))
    answers.append(await answer(lambda: runner.declare(labels=["self-hosted", "local"])))
    first = await runner.fetch_task(0)
    answers.append(await answer(lambda: runner.fetch_task(0)))
    answers.append(await answer(lambda: runner.fetch_task(first.tasks_version)))  # the fast path
    gitea.submit("owner/repo", workflow(job("one", ["self-hosted", "local"]), job("two", ["self-hosted", "local"])))
    claimed = await runner.fetch_task(first.tasks_version)
    answers.append(await answer(lambda: _same(claimed)))
    answers.append(await answer(lambda: runner.fetch_task(0)))  # spent: nothing while its task runs
    assert claimed.task is not None
    task_id = claimed.task.id
    answers.append(await runner.update_log(task_id, 0, [LogRow(now(), "a"), LogRow(now(), "b")]))
    answers.append(await runner.update_log(task_id, 5, [LogRow(now(), "gap")]))  # ahead of the log: ack only
    answers.append(await answer(lambda: runner.update_task(TaskState(id=task_id), {"k": "v"})))
    answers.append(await answer(lambda: runner.update_task(final_state(task_id, Result.SUCCESS))))
    answers.append(await answer(lambda: runner.fetch_task(0)))  # the final UpdateTask deleted it
    answers.append(await answer(lambda: runner.update_task(TaskState(id=task_id), retry=NO_RETRY)))
    return answers


async def _same(value: Any) -> Any:
    return value


@pytest.mark.parametrize("mode", ["gitea", "forgejo"])
async def test_the_in_process_stand_in_answers_as_the_double_over_http(
    gitea_factory: Any, tmp_path: Path, mode: str
) -> None:
    async with gitea_factory(mode=mode, pbkdf2_iterations=1) as served:
        over_http = await scenario(served, GiteaClient(served.url))
    local = GiteaDouble(tmp_path / "in-process", mode=mode, pbkdf2_iterations=1)
    try:
        in_process = await scenario(local, InProcessGitea(local).client())
    finally:
        local.close()
    assert in_process == over_http
    assert over_http[5] == ("fetch", over_http[4][1], None)  # the fast path answered nothing new
    assert over_http[1][0] == "RegistrationRefused" and over_http[1][2] == "runner registration token not found"
    assert over_http[-2][0] == "Unauthenticated"
