"""Release profiles: what a runner sees differ between Gitea 1.24, 1.25, 1.26 and main.

Each test pins one difference of `dynrunner.doubles.gitea.profiles` against the double over
HTTP, for every profile where it applies (docs/gitea-double.md cites the sources).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pyqwest
import pytest

from dynrunner.doubles.gitea import GiteaDouble, tasks
from dynrunner.doubles.gitea.profiles import PROFILES
from dynrunner.proto.gitea import Internal, LogRow, Result, StepState, TaskState, Unauthenticated, Unavailable
from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.gitea_calls import final_state, job, now, register, workflow
from tests.fixtures.harness import wait_for

RELEASED = ("1.24", "1.25", "1.26")
EVERY = (*RELEASED, "main")


async def _declare_headers(gitea: GiteaDouble, uuid: str, token: str) -> dict[str, str]:
    body = json.dumps({"version": "v", "labels": ["self-hosted"], "capabilities": ["cancelling"]}).encode()
    response = await pyqwest.Client().post(
        f"{gitea.url}/api/actions/runner.v1.RunnerService/Declare",
        headers={"content-type": "application/json", "x-runner-uuid": uuid, "x-runner-token": token},
        content=body,
    )
    assert response.status == 200
    return {k.lower(): v for k, v in response.headers.items()}


@pytest.mark.parametrize("gitea_profile", EVERY)
async def test_only_main_knows_the_cancelling_capability(gitea: GiteaDouble, gitea_profile: str) -> None:
    runner = await register(gitea, ephemeral=True, capabilities=("cancelling",))
    [registered] = gitea.runners()
    assert registered.cancelling_support is (gitea_profile == "main")
    assert runner.credentials is not None
    headers = await _declare_headers(gitea, runner.credentials.uuid, runner.credentials.token)
    assert gitea.runners()[0].cancelling_support is (gitea_profile == "main")
    expected = "job-summary" if gitea_profile == "main" else None
    assert headers.get("x-gitea-actions-capabilities") == expected


@pytest.mark.parametrize("gitea_profile", RELEASED)
async def test_a_cancel_ends_the_task_at_once_and_deletes_the_ephemeral_runner(gitea: GiteaDouble) -> None:
    """`CancelJobs` → `StopTask(task, cancelled)` on every release: the task, its job and its
    unfinished steps end cancelled, and finalizing deletes the ephemeral runner, so the
    executor's next call fails "unregistered runner" although it declared `cancelling`."""
    runner = await register(gitea, ephemeral=True, capabilities=("cancelling",))
    run = gitea.submit("owner/repo", workflow(job("build", steps=2)))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    task_id = fetched.task.id
    await runner.update_task(TaskState(id=task_id, steps=[StepState(id=0, started_at=now())]))
    await runner.update_log(task_id, 0, [LogRow(now(), "working")])
    gitea.cancel_run(run.id)
    task = gitea.task(task_id)
    assert task.status == "cancelled" and task.stopped > 0
    assert [s.status for s in task.steps] == ["cancelled", "cancelled"]
    assert gitea.jobs(run.id)[0].status == "cancelled"
    assert gitea.runners() == []  # deleted with the task's end
    with pytest.raises(Unauthenticated):
        await runner.update_task(TaskState(id=task_id))
    with pytest.raises(Unauthenticated):
        await runner.update_log(task_id, 1, [LogRow(now(), "the last lines")], no_more=True)
    assert gitea.task(task_id).log_rows == ["working"]  # nothing more gets in


async def test_on_main_the_same_runner_is_told_cancelled_and_reports_its_last_lines(gitea: GiteaDouble) -> None:
    runner = await register(gitea, ephemeral=True, capabilities=("cancelling",))
    run = gitea.submit("owner/repo", workflow(job("build")))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    gitea.cancel_run(run.id)
    assert gitea.task(fetched.task.id).status == "cancelling"
    assert (await runner.update_task(TaskState(id=fetched.task.id))).result is Result.CANCELLED
    assert await runner.update_log(fetched.task.id, 0, [LogRow(now(), "cleaned up")], no_more=True) == 1
    assert (await runner.update_task(final_state(fetched.task.id, Result.CANCELLED))).result is Result.CANCELLED
    assert gitea.task(fetched.task.id).status == "cancelled" and gitea.runners() == []


def _lose_the_first_race(monkeypatch: pytest.MonkeyPatch, gitea: GiteaDouble, rival_uuid: str) -> None:
    """Another runner takes the first candidate between this pick's scan and its claim."""
    original = tasks.claim
    raced: list[int] = []

    def claim(store: Any, runner: Any, job_id: int, *args: Any) -> Any:
        if not raced and runner["uuid"] != rival_uuid:
            raced.append(job_id)
            with store.read() as conn:
                rival = conn.execute("SELECT * FROM runner WHERE uuid = ?", (rival_uuid,)).fetchone()
            assert original(store, rival, job_id, *args) is not None
        return original(store, runner, job_id, *args)

    monkeypatch.setattr(tasks, "claim", claim)


@pytest.mark.parametrize("gitea_profile", RELEASED)
async def test_a_lost_claim_race_answers_no_task_with_the_latest_version(
    gitea: GiteaDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    """go-gitea/gitea#33492: `CreateTaskForRunner` claims only the first matching job; when
    another runner took it, the answer is "no task" with the latest tasks_version, and a
    runner that keeps that version is told "no task" while a job waits, until a bump."""
    loser = await register(gitea, name="loser")
    rival = await register(gitea, name="rival")
    assert rival.credentials is not None
    run = gitea.submit("owner/repo", workflow(job("one"), job("two")))
    _lose_the_first_race(monkeypatch, gitea, rival.credentials.uuid)
    lost = await loser.fetch_task(0)
    assert lost.task is None and lost.tasks_version == gitea.tasks_version()
    assert [j.status for j in gitea.jobs(run.id)] == ["running", "waiting"]
    stalled = await loser.fetch_task(lost.tasks_version)
    assert stalled.task is None  # "two" waits, but the version says there is nothing new
    assert (await loser.fetch_task(0)).task is not None  # a scan finds it


async def test_on_main_a_lost_claim_race_moves_on_to_the_next_job(
    gitea: GiteaDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    loser = await register(gitea, name="loser")
    rival = await register(gitea, name="rival")
    assert rival.credentials is not None
    run = gitea.submit("owner/repo", workflow(job("one"), job("two")))
    _lose_the_first_race(monkeypatch, gitea, rival.credentials.uuid)
    assert (await loser.fetch_task(0)).task is not None
    assert [j.status for j in gitea.jobs(run.id)] == ["running", "running"]


@pytest.mark.parametrize("gitea_profile", EVERY)
async def test_a_finished_job_bumps_the_version_only_on_main(gitea: GiteaDouble, gitea_profile: str) -> None:
    runner = await register(gitea)
    gitea.submit("owner/repo", workflow(job("one"), job("two", runs_on="[other]")))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    before = gitea.tasks_version()
    await runner.update_task(final_state(fetched.task.id))
    assert gitea.tasks_version() == before + (1 if gitea_profile == "main" else 0)


@pytest.mark.parametrize("gitea_profile", EVERY)
async def test_a_fetch_cancelled_after_its_claim_is_released_only_on_main(
    gitea: GiteaDouble, gitea_profile: str
) -> None:
    """go-gitea/gitea#38343: before it, a client that gave up after Gitea claimed a job left
    the job running with nobody on it, until the zombie reaper failed it."""
    runner = await register(gitea, ephemeral=True)
    run = gitea.submit("owner/repo", workflow(job("build")))
    gitea.hooks.build_delay_s = 0.4
    with pytest.raises(Unavailable):
        await runner.fetch_task(0, timeout_s=0.1)
    # The claim is released (or kept) when the double's FetchTask ends, 0.4 s on, later under load.
    await wait_for(lambda: gitea.costs().calls.get("FetchTask"), within=30, what="the FetchTask to end")
    if gitea_profile == "main":
        await wait_for(lambda: gitea.jobs(run.id)[0].status == "waiting", within=30, what="the claim released")
        assert gitea.jobs(run.id)[0].task_id == 0
        return
    await asyncio.sleep(0.2)  # a release would follow the call's end at once
    [claimed] = gitea.jobs(run.id)
    assert claimed.status == "running" and claimed.task_id != 0
    gitea.hooks.build_delay_s = 0
    assert (await runner.fetch_task(0)).task is None  # the runner holds a running task
    gitea.advance_clock(601)
    assert gitea.reap_zombies() == [claimed.task_id]
    assert gitea.jobs(run.id)[0].status == "failure"


@pytest.mark.parametrize("gitea_profile", EVERY)
async def test_the_runtime_token_lifetime(gitea: GiteaDouble) -> None:
    """1 h + ENDLESS_TASK_TIMEOUT on every profile: 1.24 too from v1.24.6 (24 h before; the
    real v1.24.6 showed the double's old 1.24 rule wrong, docs/compatibility.md)."""
    runner = await register(gitea)
    gitea.submit("owner/repo", workflow(job("build")))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None and fetched.task.context is not None
    claims = gitea.decode_runtime_token(fetched.task.context["gitea_runtime_token"])
    assert claims["exp"] - claims["nbf"] == 4 * 3600  # type: ignore[operator]


async def test_the_runtime_token_follows_the_endless_task_timeout(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(profile="1.26", endless_task_timeout_s=6 * 3600) as gitea:
        runner = await register(gitea)
        gitea.submit("owner/repo", workflow(job("build")))
        fetched = await runner.fetch_task(0)
        assert fetched.task is not None and fetched.task.context is not None
        claims = gitea.decode_runtime_token(fetched.task.context["gitea_runtime_token"])
        assert claims["exp"] - claims["nbf"] == 7 * 3600  # type: ignore[operator]


@pytest.mark.parametrize("gitea_profile", EVERY)
async def test_an_empty_no_more_finalizes_the_log_from_1_26(gitea: GiteaDouble, gitea_profile: str) -> None:
    """go-gitea/gitea#37631, on main and backported to v1.26.2 (the real v1.26.4 archives)."""
    runner = await register(gitea)
    gitea.submit("owner/repo", workflow(job("build")))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    assert await runner.update_log(fetched.task.id, 0, [LogRow(now(), "one")]) == 1
    assert await runner.update_log(fetched.task.id, 1, [], no_more=True) == 1
    assert gitea.task(fetched.task.id).log_archived is (gitea_profile in ("1.26", "main"))


@pytest.mark.parametrize("gitea_profile", EVERY)
async def test_gitea_stops_a_task_after_three_hours_and_deletes_its_runner(
    gitea: GiteaDouble, gitea_profile: str
) -> None:
    """`ENDLESS_TASK_TIMEOUT` (3 h, checked every 30 min): a task started longer ago fails,
    however often it reported, whatever its `timeout-minutes`; its ephemeral runner goes."""
    runner = await register(gitea, ephemeral=True)
    run = gitea.submit("owner/repo", workflow(job("long", extra="timeout-minutes: 600")))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    gitea.advance_clock(2.9 * 3600)
    await runner.update_task(TaskState(id=fetched.task.id, steps=[StepState(id=0, started_at=now())]))
    assert gitea.reap_endless_tasks() == []
    gitea.advance_clock(0.2 * 3600)
    await runner.update_task(TaskState(id=fetched.task.id))  # a heartbeat does not save it
    assert gitea.reap_endless_tasks() == [fetched.task.id]
    assert gitea.task(fetched.task.id).status == "failure"
    assert gitea.jobs(run.id)[0].status == "failure"
    assert gitea.runners() == []
    with pytest.raises(Unauthenticated):
        await runner.update_task(TaskState(id=fetched.task.id))


@pytest.mark.parametrize(("gitea_profile", "writes"), [*((p, 5) for p in RELEASED), ("main", 1)])
async def test_each_idle_poll_costs_a_token_hash_and_before_main_a_runner_write(
    gitea: GiteaDouble, writes: int
) -> None:
    runner = await register(gitea)
    gitea.reset_costs()
    version = 0
    for _ in range(5):
        version = (await runner.fetch_task(version)).tasks_version
    costs = gitea.costs()
    assert costs.calls == {"FetchTask": 5}
    assert costs.pbkdf2 == 5
    assert costs.runner_writes == writes
    assert costs.version_reads == 5 and costs.scans == 1  # the first poll scans; the others take the fast path
    assert costs.cpu_s["FetchTask"] > 0


@pytest.mark.parametrize("gitea_profile", EVERY)
async def test_only_main_throttles_picks(gitea_factory: GiteaFactory, gitea_profile: str) -> None:
    async with gitea_factory(profile=gitea_profile, max_concurrent_task_picks=0) as gitea:
        runner = await register(gitea)
        gitea.submit("owner/repo", workflow(job("build")))
        fetched = await runner.fetch_task(0)
        assert (fetched.task is None) is (gitea_profile == "main")


@pytest.mark.parametrize("gitea_profile", ["1.24", "1.25"])
async def test_runners_cannot_be_disabled_before_1_26(gitea: GiteaDouble) -> None:
    await register(gitea)
    with pytest.raises(ValueError, match=r"1\.26"):
        gitea.set_runner_disabled(gitea.runners()[0].id)


@pytest.mark.parametrize(
    ("gitea_profile", "error"), [("1.25", "pick task: runner has been removed"), ("1.26", "get runner")]
)
async def test_a_runner_deleted_during_its_fetch(gitea: GiteaDouble, error: str) -> None:
    """1.26 reloads the runner before the pick and finds it gone; before, the interceptor's
    copy picks, and PickTask's ephemeral rule reports the finished task's runner removed."""
    runner = await register(gitea, ephemeral=True)
    gitea.submit("owner/repo", workflow(job("one"), job("two")))
    first = await runner.fetch_task(0)
    assert first.task is not None
    gitea.hooks.fetch_pause_s = 0.3
    racing = asyncio.ensure_future(runner.fetch_task(0))
    await asyncio.sleep(0.1)
    await runner.update_task(final_state(first.task.id))  # deletes the ephemeral runner
    with pytest.raises(Internal) as caught:
        await racing
    assert error in caught.value.message and not caught.value.transient


async def test_the_serve_command_answers_as_the_chosen_release(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "dynrunner-gitea-double"),
        "serve",
        "--state-dir",
        str(tmp_path),
        "--profile",
        "1.26",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        assert ready["profile"] == "1.26"
        response = await pyqwest.Client().get(f"{ready['url']}/_double/health")
        assert json.loads(response.content)["profile"] == "1.26"
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 30) == 0


def test_every_profile_sets_every_rule() -> None:
    assert set(PROFILES) == {"1.24", "1.25", "1.26", "main"}
    assert all(p.name == name for name, p in PROFILES.items())
