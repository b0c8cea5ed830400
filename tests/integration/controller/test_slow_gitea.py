"""A slow Gitea gets fewer idle polls (issue 10, item 8).

A Gitea that takes seconds to answer FetchTask is busy (a slow database: go-gitea/gitea#34198),
and every FetchTask costs it a PBKDF2 and, up to 1.26, a row write. An idle pool used to poll
at its usual pace whatever the answer time, keeping a FetchTask in flight nearly all the time.
The claim side runs as `app.Controller` wires it (two claim loops of one pool sharing a
pacer), against the double's engine in-process on virtual time, as the 1.26 release, whose
FetchTask answers take 2 s here; then a job arrives and is still picked up.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.app import CLAIM_LOOPS
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import SealedAssignment
from tests.fixtures.claim_side import ClaimSide
from tests.fixtures.gitea_inprocess import InProcessGitea, InProcessGiteaClient
from tests.fixtures.virtual_time import virtual_time

ANSWER_S = 2.0
IDLE_S = 600.0
WORKFLOW = "on: push\njobs:\n  job:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: true\n"


class Published:
    def __init__(self) -> None:
        self.at: list[float] = []

    async def publish(self, sealed_assignment: SealedAssignment) -> int:
        self.at.append(asyncio.get_running_loop().time())
        return len(self.at)


async def scenario(double: GiteaDouble) -> tuple[int, float]:
    gitea = InProcessGitea(double, asyncio.get_running_loop())
    published = Published()
    claimers = ClaimSide(gitea, double.registration_token).claimers(published)
    loops = [asyncio.create_task(c.run()) for c in claimers]
    await asyncio.sleep(IDLE_S)
    polls = gitea.calls["FetchTask"]
    submitted = asyncio.get_running_loop().time()
    double.submit("owner/repo", WORKFLOW)
    await asyncio.sleep(60.0)
    for claimer in claimers:
        claimer.stop()
    await asyncio.gather(*loops)
    [claimed] = published.at
    return polls, claimed - submitted


def test_an_idle_pool_polls_a_slow_gitea_less_and_still_picks_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetch = InProcessGiteaClient.fetch_task

    async def slow_fetch(self: InProcessGiteaClient, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(ANSWER_S)
        return await fetch(self, *args, **kwargs)

    monkeypatch.setattr(InProcessGiteaClient, "fetch_task", slow_fetch)
    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1, profile="1.26")
    try:
        with virtual_time() as runner:
            polls, pickup = runner.run(scenario(double))
    finally:
        double.close()
    in_flight = polls * ANSWER_S / IDLE_S
    print(
        f"\n{polls} FetchTasks in {IDLE_S:.0f} s of 2-second answers ({in_flight:.0%} of the time one in flight); "
        f"pickup {pickup:.1f} s"
    )
    # Each loop waits 3× the answer time after it: a FetchTask in flight at most half the time
    # for the pool's two loops together (before: ~1.3 in flight all the time, 400 polls).
    assert polls <= CLAIM_LOOPS * IDLE_S / (4 * ANSWER_S) + CLAIM_LOOPS
    assert pickup <= 4 * ANSWER_S + 1.0
