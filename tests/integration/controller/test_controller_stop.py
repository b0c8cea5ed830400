"""The controller's stop completes when a request in flight swallows the cancellation meant
to stop a loop (Python 3.11's `asyncio.wait_for` can): here a start follower's stage line,
written while the controller stops. Before, the follower went on following a start that
never ended, and the stop waited for it for good."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.controller.claiming.registrations import Registrations
from dynrunner.controller.claiming.registrations_store import ArmedRegistration
from dynrunner.controller.infra.loops import Fatal, Stopping
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import FetchResult, GiteaClient, LogRow
from tests.fixtures.backends import PULLING, DelegatingBackend, EndlessPull
from tests.fixtures.harness import InProcess, build_config, fake_executor_command, wait_for
from tests.fixtures.lost_cancel import LostCancel, ended

WORKFLOW = "on: push\njobs:\n  build:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: echo hi\n"


async def test_the_stop_completes_when_a_stage_line_swallows_the_cancellation(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost = LostCancel()
    update_log = GiteaClient.update_log

    async def losing(self: GiteaClient, task_id: int, index: int, rows: Sequence[LogRow], **kwargs: Any) -> int:
        if any(PULLING in row.content for row in rows) and not lost.lost:
            await lost.answer(None)  # held until the stop cancels it, which it swallows
        return await update_log(self, task_id, index, rows, **kwargs)

    monkeypatch.setattr(GiteaClient, "update_log", losing)
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    assert cfg.pools[0].backend.root_dir is not None
    backend = EndlessPull(LocalBackend("local", cfg.pools[0].backend.root_dir, fake_executor_command()))
    running = await InProcess(cfg, backends={"local": backend}).start()
    assert running.task is not None
    gitea.submit("owner/repo", WORKFLOW)
    await wait_for(lost.waiting.is_set, what="the follower writing its stage line")
    running.stop_event.set()
    assert await ended(running.task, 60), "the controller's stop did not complete"
    await running.task
    assert lost.lost == 1
    [task] = [gitea.task(job.task_id) for run in gitea.runs() for job in run.jobs]
    assert any(PULLING in row for row in task.log_rows)  # the answer the stop did not cancel
    beating = [t for t in asyncio.all_tasks() if t.get_name().startswith("heartbeat-")]
    assert all([await ended(t) for t in beating]), "a heartbeat beats on after the stop"


class FailingWatch(DelegatingBackend):
    """A backend whose watch fails for good once `fail` is set (a controller that must exit)."""

    def __init__(self, inner: LocalBackend) -> None:
        super().__init__(inner)
        self.fail = asyncio.Event()

    async def watch(self, wake: Any) -> None:
        await self.fail.wait()
        raise Fatal("the watch cannot go on")


async def test_a_loop_failing_for_good_ends_the_controller_when_a_poll_swallows_the_cancellation(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Fatal error cancels every loop, and a claim loop whose FetchTask lost that cancellation
    went on polling: the controller never exited with the error."""
    lost = LostCancel()
    fetch_task = GiteaClient.fetch_task
    armed = asyncio.Event()

    async def losing(self: GiteaClient, tasks_version: int = 0, **kwargs: Any) -> FetchResult:
        if armed.is_set() and not lost.lost:
            return await lost.answer(FetchResult(None, tasks_version))
        return await fetch_task(self, tasks_version, **kwargs)

    monkeypatch.setattr(GiteaClient, "fetch_task", losing)
    await _fails_for_good_once_held(gitea, nats_url, tmp_path, lost, armed, within=60)


async def test_a_loop_failing_for_good_ends_the_controller_when_arming_swallows_the_cancellation(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Fatal error cancelled the claim loops before their stop flags were set, and a loop
    whose arming lost that cancellation sent a FetchTask that nothing cancels: the controller
    never exited with the error. Here that FetchTask never answers, so only a loop that sends
    none lets the controller end."""
    lost = LostCancel()
    armed = Registrations.armed
    fetch_task = GiteaClient.fetch_task
    losing_armed = asyncio.Event()

    async def losing(self: Registrations, until: Stopping | None = None) -> ArmedRegistration:
        reg = await armed(self, until)
        if losing_armed.is_set() and not lost.lost:
            return await lost.answer(reg)  # held until cancelled, which it swallows
        return reg

    async def unanswered(self: GiteaClient, tasks_version: int = 0, **kwargs: Any) -> FetchResult:
        if lost.lost:
            await asyncio.Event().wait()  # a poll sent after the lost cancellation: only cancelled again
        return await fetch_task(self, tasks_version, **kwargs)

    monkeypatch.setattr(Registrations, "armed", losing)
    monkeypatch.setattr(GiteaClient, "fetch_task", unanswered)
    await _fails_for_good_once_held(gitea, nats_url, tmp_path, lost, losing_armed, within=10)


async def _fails_for_good_once_held(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, lost: LostCancel, hold: asyncio.Event, *, within: float
) -> None:
    """Start a controller, set `hold` and, once a claim loop is held by `lost`, fail its
    backend's watch for good: the controller must end within `within` s with that error, and
    a claim loop must have swallowed a cancellation."""
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    assert cfg.pools[0].backend.root_dir is not None
    backend = FailingWatch(LocalBackend("local", cfg.pools[0].backend.root_dir, fake_executor_command()))
    running = await InProcess(cfg, backends={"local": backend}).start()
    assert running.task is not None
    hold.set()
    await wait_for(lost.waiting.is_set, what="a claim loop held")
    backend.fail.set()
    assert await ended(running.task, within), "the controller did not exit"
    failed: list[BaseException] = []
    try:
        await running.task
    except* Fatal as group:
        failed = list(group.exceptions)
    assert [str(err) for err in failed] == ["the watch cannot go on"]
    assert lost.lost >= 1
