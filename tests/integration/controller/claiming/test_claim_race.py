"""A claim race lost on Gitea ≤ 1.26 does not stall the loop that lost it (issue 10, item 3).

(The first test: another runner wins; the second: the pool's own two loops race.)

Up to 1.26, `CreateTaskForRunner` answers "no task" — with the latest tasks_version — when
another runner claimed the job first, and jobs finishing bump nothing: a claim loop that
kept sending that version was told "nothing new" while the next job waited, until an
unrelated bump. The claim side runs here as `app.Controller` wires it (claimer, real
`Registrations` and `RegistrationStore`, `Capacity`, `Sealer`), against the double's engine
in-process on virtual time, as the 1.26 release. Another runner (the test's) wins the race
for the loop's first candidate, deterministically, inside the loop's own claim.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dynrunner.doubles.gitea import GiteaDouble, tasks
from dynrunner.proto.assignment import SealedAssignment
from tests.fixtures.claim_side import ClaimSide
from tests.fixtures.gitea_inprocess import InProcessGitea
from tests.fixtures.harness import build_config, in_process, live_runners, wait_for, wait_run_done
from tests.fixtures.virtual_time import virtual_time

LABELS = ["self-hosted", "local"]
TWO_SLOW_JOBS = (
    "on: push\njobs:\n"
    "  one:\n    runs-on: [self-hosted, local]\n    env: {FAKE_EXECUTOR: 'sleep:6'}\n    steps:\n      - run: true\n"
    "  two:\n    runs-on: [self-hosted, local]\n    env: {FAKE_EXECUTOR: 'sleep:6'}\n    steps:\n      - run: true\n"
)
TWO_JOBS = (
    "on: push\njobs:\n"
    "  one:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: true\n"
    "  two:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: true\n"
)


class Published:
    """The assignment log, played in-process: it records when each claim was published."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}

    async def publish(self, sealed_assignment: SealedAssignment) -> int:
        self.at[sealed_assignment.header.task_id] = asyncio.get_running_loop().time()
        return len(self.at)


def rival_wins_first_claim(monkeypatch: pytest.MonkeyPatch, rival_uuid: str) -> list[float]:
    """The rival runner takes the first job the pool's runner tries to claim, just before
    it does (the window between Gitea's candidate scan and its claim). Returns when."""
    original = tasks.claim
    lost_at: list[float] = []

    def claim(store: Any, runner: Any, job_id: int, *args: Any) -> Any:
        if not lost_at and runner["uuid"] != rival_uuid:
            lost_at.append(asyncio.get_running_loop().time())
            with store.read() as conn:
                rival = conn.execute("SELECT * FROM runner WHERE uuid = ?", (rival_uuid,)).fetchone()
            assert original(store, rival, job_id, *args) is not None
        return original(store, runner, job_id, *args)

    monkeypatch.setattr(tasks, "claim", claim)
    return lost_at


async def scenario(double: GiteaDouble, monkeypatch: pytest.MonkeyPatch) -> tuple[float, dict[int, float]]:
    gitea = InProcessGitea(double, asyncio.get_running_loop())
    rival = await gitea.client().register(name="rival", registration_token=double.registration_token, labels=LABELS)
    lost_at = rival_wins_first_claim(monkeypatch, rival.uuid)
    published = Published()
    [claimer] = ClaimSide(gitea, double.registration_token).claimers(published, loops=1)
    loop = asyncio.create_task(claimer.run())
    await asyncio.sleep(5.0)  # the loop is idle, polling with the version it was told
    double.submit("owner/repo", TWO_JOBS)
    await asyncio.sleep(600.0)
    claimer.stop()
    await loop
    [lost] = lost_at
    return lost, published.at


def test_a_loop_that_lost_a_claim_race_claims_the_next_job_within_the_trust_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1, profile="1.26")
    try:
        with virtual_time() as runner:
            lost_at, published = runner.run(scenario(double, monkeypatch))
        jobs = {j.name: j for j in double.jobs(double.runs()[0].id)}
    finally:
        double.close()
    assert list(published) == [jobs["two"].task_id]  # the loop got "two" (before the fix: nothing), once
    assert jobs["one"].status == jobs["two"].status == "running"
    waited = published[jobs["two"].task_id] - lost_at
    print(f"\nafter the lost race, job two waited {waited:.1f} s (virtual) for the idle loop")
    assert waited < 15.0  # before the fix: never (600 s of polling told "nothing new")


@pytest.mark.parametrize("gitea_profile", ["1.26"])
async def test_the_loops_of_one_pool_racing_for_a_job_leave_no_slot_idle(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    """The two claim loops of a pool race each other too: both scan, both try the first job,
    one loses and is told "no task" with the latest version while it holds the pool's other
    permit. Before, it kept that version (for 10 s with the time bound; before that, until a
    bump) and the second job waited for the first to finish. A sibling's claim now voids it."""
    gitea.hooks.claim_pause_s = 0.3  # both loops' scans fall in the window before either claims
    cfg = build_config(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "state",
        nats_url=nats_url,
        max_concurrency=2,
    )
    async with in_process(cfg):
        await wait_for(lambda: len(live_runners(gitea)) == 2, what="both loops armed")
        run = gitea.submit("owner/repo", TWO_SLOW_JOBS)
        await wait_for(
            lambda: [j.status for j in gitea.jobs(run.id)] == ["running", "running"],
            within=5.0,
            interval=0.02,
            what="both jobs running at once (each runs 6 s)",
        )
        assert (await wait_run_done(gitea, run.id)).status == "success"
