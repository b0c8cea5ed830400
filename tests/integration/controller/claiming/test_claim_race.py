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

from dynrunner.controller.claiming.build import ClaimSettings
from dynrunner.controller.claiming.claimer import TASKS_VERSION_TRUST_S
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.coordination.permits import PermitLedger
from dynrunner.doubles.gitea import GiteaDouble, tasks
from dynrunner.proto.assignment import SealedAssignment
from tests.fixtures.claim_side import ClaimSide
from tests.fixtures.gitea_inprocess import InProcessGitea
from tests.fixtures.harness import build_config, in_process, live_runners, wait_for, wait_run_done
from tests.fixtures.kv_memory import MemoryKeyValue
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


@pytest.mark.parametrize("profile", ["1.24", "1.25", "1.26"])
def test_a_loop_that_lost_a_claim_race_scans_again_at_its_next_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    """Issue 18, item 6: a scan answered "no task" may be a lost race on these releases, so the
    version it brought is trusted only once another answer confirmed it (the same version, no
    claim of the pool between). Before, the loop trusted it at once, and while the rival (a
    loop of another replica, another controller) took the first job, the second waited out
    `TASKS_VERSION_TRUST_S` with the loop's permit free."""
    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1, profile=profile)
    try:
        with virtual_time() as runner:
            lost_at, published = runner.run(scenario(double, monkeypatch))
        jobs = {j.name: j for j in double.jobs(double.runs()[0].id)}
    finally:
        double.close()
    assert list(published) == [jobs["two"].task_id]
    waited = published[jobs["two"].task_id] - lost_at
    print(f"\n{profile}: after the lost race, job two waited {waited:.1f} s (virtual)")
    assert waited <= 2 * ClaimSettings(pool="p", backend="local", gitea_url="").fetch_interval_max_s  # before: 10 s


THREE_JOBS = TWO_JOBS + "  three:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: true\n"


async def another_replica_wins_twice(double: GiteaDouble, monkeypatch: pytest.MonkeyPatch) -> tuple[float, float]:
    """Replica A's one claim loop and replica B share the pool's permits (one bucket, each its
    own `PermitLedger`). B's runner takes the first two jobs A's loop tries to claim, just
    before it does, and B reserves and binds a permit for each, as its claimer does. Returns
    when A lost the first race and when A published the third job."""
    gitea = InProcessGitea(double, asyncio.get_running_loop())
    permits = MemoryKeyValue("permits")
    incarnations = {"a": "a-1", "b": "b-1"}

    async def incarnation_of(name: str) -> str | None:
        return incarnations.get(name)

    def ledger(replica: str) -> PermitLedger:
        return PermitLedger(
            permits,  # type: ignore[arg-type]
            "local",
            4,
            replica=replica,
            incarnation=incarnations[replica],
            incarnation_of=incarnation_of,
        )

    ledger_a, ledger_b = ledger("a"), ledger("b")
    running = [asyncio.create_task(x.run()) for x in (ledger_a, ledger_b)]
    rival = await gitea.client().register(name="b", registration_token=double.registration_token, labels=LABELS)
    b_claims: list[asyncio.Task[None]] = []

    async def b_claimed(job_id: int) -> None:
        ledger_b.bind(await ledger_b.acquire(), f"b-{job_id}")

    original = tasks.claim
    lost_at: list[float] = []

    def claim(store: Any, runner: Any, job_id: int, *args: Any) -> Any:
        if len(lost_at) < 2 and runner["uuid"] != rival.uuid:
            lost_at.append(asyncio.get_running_loop().time())
            with store.read() as conn:
                winner = conn.execute("SELECT * FROM runner WHERE uuid = ?", (rival.uuid,)).fetchone()
            assert original(store, winner, job_id, *args) is not None
            b_claims.append(asyncio.get_running_loop().create_task(b_claimed(job_id)))
        return original(store, runner, job_id, *args)

    monkeypatch.setattr(tasks, "claim", claim)
    side = ClaimSide(gitea, double.registration_token)
    side.capacity = Capacity("local", 4, ledger_a)
    published = Published()
    [claimer] = side.claimers(published, loops=1)
    loop = asyncio.create_task(claimer.run())
    await asyncio.sleep(5.0)  # A's loop is idle, polling with the version it was told
    double.submit("owner/repo", THREE_JOBS)
    await asyncio.sleep(120.0)
    claimer.stop()
    await loop
    await asyncio.gather(*b_claims)
    for x in (ledger_a, ledger_b):
        x.stop()
    await asyncio.gather(*running)
    [three] = [j for j in double.jobs(double.runs()[0].id) if j.name == "three"]
    assert list(published.at) == [three.task_id]
    return lost_at[0], published.at[three.task_id]


def test_a_loop_that_lost_races_to_another_replica_claims_at_its_next_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18, item 6: two races lost in a row to another replica. The second scan answered
    "no task" with the version of the first, and no loop of the pool claimed *here* between:
    the loop took that as confirmed and trusted it for 10 s while the third job waited. The
    pool's shared permits show the other replica's claims: a claim of the pool seen anywhere
    between two answers leaves the version untrusted, as a sibling's claim always did."""
    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1, profile="1.26")
    try:
        with virtual_time() as runner:
            lost_at, claimed_at = runner.run(another_replica_wins_twice(double, monkeypatch))
    finally:
        double.close()
    waited = claimed_at - lost_at
    print(f"\nafter two races lost to another replica, job three waited {waited:.1f} s (virtual)")
    assert waited <= 3 * ClaimSettings(pool="p", backend="local", gitea_url="").fetch_interval_max_s  # before: 10-20 s


def test_an_idle_pool_scans_once_per_trust_bound_and_loop(tmp_path: Path) -> None:
    """The confirmation of an empty scan costs an idle pool nothing: the scan that renews a
    loop's trust every `TASKS_VERSION_TRUST_S` answers the version the loop holds, and
    confirms it. Ten idle minutes, the pool's two loops: about 2 × 60 scans (the figure of
    docs/operations.md, 0.2 a second per pool), of about 600 FetchTasks."""

    async def idle() -> None:
        gitea = InProcessGitea(double, asyncio.get_running_loop())
        claimers = ClaimSide(gitea, double.registration_token).claimers(Published())
        loops = [asyncio.create_task(c.run()) for c in claimers]
        await asyncio.sleep(60.0)
        double.reset_costs()
        await asyncio.sleep(600.0)
        for c in claimers:
            c.stop()
        await asyncio.gather(*loops)

    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1, profile="1.26")
    try:
        with virtual_time() as runner:
            runner.run(idle())
        costs = double.costs()
    finally:
        double.close()
    print(f"\nten idle minutes: {costs.version_reads} FetchTasks, {costs.scans} scans")
    assert costs.version_reads >= 500
    assert costs.scans <= 2 * 600 / TASKS_VERSION_TRUST_S + 4


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
