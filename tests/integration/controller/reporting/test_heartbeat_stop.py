"""A heartbeat cancelled while a beat swallows the cancellation (Python 3.11's
`asyncio.wait_for` can) beats no more: it stops on its flag."""

from __future__ import annotations

from typing import Any

from dynrunner.controller.reporting.stagelog import Heartbeat
from dynrunner.proto.gitea import GiteaClient, TaskState
from tests.fixtures.lost_cancel import LostCancel, ended


class LosingGitea(GiteaClient):
    """UpdateTask loses the cancellation and answers (a task still running)."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9")
        self.lost = LostCancel()
        self.beats = 0

    async def update_task(self, state: TaskState, *args: Any, **kwargs: Any) -> TaskState:
        self.beats += 1
        if self.beats == 1:
            return await self.lost.answer(TaskState(id=state.id))
        return TaskState(id=state.id)


async def test_a_heartbeat_cancelled_during_a_beat_that_swallows_it_beats_no_more() -> None:
    """Before, it went on beating every interval: once the executor runs, every beat of ours
    makes Gitea recompute the job's step states."""
    gitea = LosingGitea()
    heartbeat = Heartbeat(gitea, 7, interval_s=0.01)
    heartbeat.start()
    beating = heartbeat.task
    assert beating is not None
    await gitea.lost.waiting.wait()
    heartbeat.cancel()
    assert await ended(beating), "the heartbeat beat on after it was cancelled"
    assert (gitea.lost.lost, gitea.beats) == (1, 1)
