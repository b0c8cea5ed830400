"""FetchTask: tasks_version, matching, scope, ordering, atomic claims, release, throttling."""

from __future__ import annotations

import asyncio

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import Result, Unavailable
from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.gitea_calls import final_state, job, register, workflow


async def test_tasks_version_is_never_zero(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    fetched = await runner.fetch_task(0)
    assert fetched.task is None
    assert fetched.tasks_version == 1
    assert gitea.tasks_version() == 1


async def test_equal_version_is_answered_without_a_scan(gitea: GiteaDouble) -> None:
    first = await register(gitea, name="a")
    second = await register(gitea, name="b")
    gitea.submit("owner/repo", workflow(job("one"), job("two")))
    claimed = await first.fetch_task(0)
    assert claimed.task is not None
    # `second` already saw this version: no scan, so no task although "two" is waiting.
    skipped = await second.fetch_task(claimed.tasks_version)
    assert skipped.task is None and skipped.tasks_version == claimed.tasks_version
    # A runner that resets its version to 0 after a task (as act_runner does) scans again.
    assert (await second.fetch_task(0)).task is not None


async def test_version_bumps_when_a_run_with_waiting_jobs_is_inserted(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    seen = (await runner.fetch_task(0)).tasks_version
    gitea.submit("owner/repo", workflow(job("build")))
    assert gitea.tasks_version() == seen + 1
    assert gitea.tasks_version(repo="owner/repo") == 1
    assert gitea.tasks_version(owner="owner") == 1
    assert (await runner.fetch_task(seen)).task is not None


async def test_version_bumps_when_a_blocked_job_becomes_waiting(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    gitea.submit("owner/repo", workflow(job("build"), job("test", extra="needs: build")))
    claimed = await runner.fetch_task(0)
    assert claimed.task is not None
    before = gitea.tasks_version()
    await runner.update_task(final_state(claimed.task.id))
    assert gitea.tasks_version() == before + 1  # "test" became waiting


async def test_version_bumps_when_a_job_finishes_while_others_still_wait(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    other = await register(gitea, ["other"], name="other")
    gitea.submit("owner/repo", workflow(job("build"), job("elsewhere", runs_on="other")))
    claimed = await runner.fetch_task(0)
    assert claimed.task is not None
    before = gitea.tasks_version()
    await runner.update_task(final_state(claimed.task.id))
    assert gitea.tasks_version() == before + 1  # "elsewhere" still waits
    took = await other.fetch_task(0)
    assert took.task is not None
    before = gitea.tasks_version()
    await other.update_task(final_state(took.task.id))
    assert gitea.tasks_version() == before  # nothing waits any more: no bump


async def test_disabling_and_enabling_a_runner_bumps_and_gates_picking(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    [view] = gitea.runners()
    gitea.submit("owner/repo", workflow(job("build")))
    before = gitea.tasks_version()
    gitea.set_runner_disabled(view.id, True)
    assert gitea.tasks_version() == before + 1
    assert (await runner.fetch_task(0)).task is None
    gitea.set_runner_disabled(view.id, False)
    assert gitea.tasks_version() == before + 2
    assert (await runner.fetch_task(0)).task is not None


@pytest.mark.parametrize(
    ("labels", "runs_on", "matches"),
    [
        (["self-hosted", "pod", "extra"], "[self-hosted, pod]", True),
        (["self-hosted"], "[self-hosted, pod]", False),
        (["self-hosted", "Pod"], "[self-hosted, pod]", False),  # case-sensitive
        (["ubuntu-latest"], "ubuntu-latest", True),
        ([], "[]", True),  # empty runs-on matches every runner
        (["anything"], "[]", True),
        (["a", "b", "g"], "{group: g, labels: [a, b]}", True),
        (["a", "b"], "{group: g, labels: [a, b]}", False),
    ],
)
async def test_label_matching(gitea: GiteaDouble, labels: list[str], runs_on: str, matches: bool) -> None:
    runner = await register(gitea, labels)
    gitea.submit("owner/repo", workflow(job("build", runs_on=runs_on)))
    assert ((await runner.fetch_task(0)).task is not None) is matches


async def test_a_job_without_runs_on_matches_every_runner(gitea: GiteaDouble) -> None:
    runner = await register(gitea, ["x"])
    gitea.submit("owner/repo", "on: push\njobs:\n  build:\n    steps:\n      - run: echo\n")
    assert (await runner.fetch_task(0)).task is not None


async def test_scoped_runners_only_see_their_scope(gitea: GiteaDouble) -> None:
    repo_runner = await register(gitea, token=gitea.new_registration_token(repo="acme/app"), name="repo")
    org_runner = await register(gitea, token=gitea.new_registration_token(owner="acme"), name="org")
    gitea.submit("other/thing", workflow(job("foreign")))
    assert (await repo_runner.fetch_task(0)).task is None
    assert (await org_runner.fetch_task(0)).task is None
    gitea.submit("acme/lib", workflow(job("sibling")))
    assert (await repo_runner.fetch_task(0)).task is None
    assert (await org_runner.fetch_task(0)).task is not None
    gitea.submit("acme/app", workflow(job("own")))
    assert (await repo_runner.fetch_task(0)).task is not None
    global_runner = await register(gitea, name="global")
    assert (await global_runner.fetch_task(0)).task is not None  # "foreign"


async def test_the_oldest_waiting_job_by_updated_then_id_comes_first(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    first = gitea.submit("owner/repo", workflow(job("first"), job("second", extra="needs: first")))
    gitea.advance_clock(5)
    later = gitea.submit("owner/repo", workflow(job("later")))
    claimed = await runner.fetch_task(0)
    assert claimed.task is not None and claimed.task.context is not None
    assert claimed.task.context["job"] == "first"
    gitea.advance_clock(5)
    await runner.update_task(final_state(claimed.task.id))  # "second" waits from now on
    second_id = next(j.id for j in gitea.jobs(first.id) if j.job_id == "second")
    assert second_id < later.jobs[0].id
    picked = await runner.fetch_task(0)
    assert picked.task is not None and picked.task.context is not None
    assert picked.task.context["job"] == "later"  # waiting longer, although its id is higher


async def test_concurrent_runners_claim_one_job_exactly_once(gitea: GiteaDouble) -> None:
    runners = [await register(gitea, name=f"r{i}") for i in range(12)]
    run = gitea.submit("owner/repo", workflow(job("only")))
    results = await asyncio.gather(*(r.fetch_task(0) for r in runners))
    winners = [r.task for r in results if r.task is not None]
    assert len(winners) == 1
    [only] = gitea.jobs(run.id)
    assert only.status == "running" and only.task_id == winners[0].id


async def test_concurrent_runners_spread_over_many_jobs_without_double_claims(gitea: GiteaDouble) -> None:
    runners = [await register(gitea, name=f"r{i}") for i in range(10)]
    run = gitea.submit("owner/repo", workflow(*(job(f"j{i}") for i in range(6))))
    results = await asyncio.gather(*(r.fetch_task(0) for r in runners))
    tasks = [r.task for r in results if r.task is not None]
    # a loser of a race moves on to the next candidate, so every job is taken once
    assert len(tasks) == 6
    assert len({t.id for t in tasks}) == 6
    assert sorted(j.task_id for j in gitea.jobs(run.id)) == sorted(t.id for t in tasks)


async def test_a_claim_creates_a_running_task_with_one_step_per_workflow_step(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    run = gitea.submit("owner/repo", workflow(job("build", steps=3)))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    task = gitea.task(fetched.task.id)
    assert task.status == "running" and task.started > 0
    assert [(s.index, s.name, s.status) for s in task.steps] == [
        (0, "Run echo build 0", "waiting"),
        (1, "Run echo build 1", "waiting"),
        (2, "Run echo build 2", "waiting"),
    ]
    assert task.log_filename == f"owner/repo/{task.id % 256:02x}/{task.id}.log"
    [claimed_job] = gitea.jobs(run.id)
    assert claimed_job.status == "running" and claimed_job.task_id == task.id
    assert gitea.run(run.id).status == "running"


async def test_a_cancelled_fetch_releases_its_claim(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    run = gitea.submit("owner/repo", workflow(job("build")))
    gitea.hooks.build_delay_s = 0.5
    with pytest.raises(Unavailable):
        await runner.fetch_task(0, timeout_s=0.15)
    await asyncio.sleep(0.6)
    [released] = gitea.jobs(run.id)
    assert (released.status, released.task_id) == ("waiting", 0)
    gitea.hooks.build_delay_s = 0
    again = await runner.fetch_task(0)
    assert again.task is not None
    assert gitea.jobs(run.id)[0].task_id == again.task.id


async def test_throttled_picks_keep_the_runners_version(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(max_concurrent_task_picks=0) as gitea:
        runner = await register(gitea)
        gitea.submit("owner/repo", workflow(job("build")))
        fetched = await runner.fetch_task(0)
        assert fetched.task is None
        assert fetched.tasks_version == 0  # the runner retries next poll instead of sleeping


async def test_a_finished_task_frees_nothing_for_a_non_ephemeral_runner(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    gitea.submit("owner/repo", workflow(job("a"), job("b")))
    first = await runner.fetch_task(0)
    assert first.task is not None
    second = await runner.fetch_task(0)  # capacity is the runner's business, not Gitea's
    assert second.task is not None
    result = await runner.update_task(final_state(first.task.id, Result.FAILURE))
    assert result.result is Result.FAILURE
