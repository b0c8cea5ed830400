"""Runs through the real client: matrix expansion, needs gating, skip cascade, `if:`,
run status, zombie reaping."""

from __future__ import annotations

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, LogRow, Result, StepState, TaskState
from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.gitea_calls import final_state, job, now, register, workflow


async def finish_next(runner: GiteaClient, result: Result) -> str:
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None and fetched.task.context is not None
    await runner.update_task(final_state(fetched.task.id, result))
    return str(fetched.task.context["job"])


def statuses(gitea: GiteaDouble, run_id: int) -> dict[str, str]:
    return {j.name: j.status for j in gitea.jobs(run_id)}


async def test_matrix_jobs_are_named_like_giteas_jobparser(gitea: GiteaDouble) -> None:
    run = gitea.submit(
        "owner/repo",
        """
on: push
jobs:
  test:
    runs-on: [self-hosted, pod]
    strategy:
      matrix:
        python: ["3.12", "3.11"]
        os: [linux]
        include:
          - python: "3.13"
            os: linux
            experimental: true
        exclude:
          - python: "3.11"
    steps: [{run: pytest}]
  named:
    name: lint ${{ matrix.tool }}
    runs-on: [self-hosted, pod]
    strategy: {matrix: {tool: [ruff, mypy]}}
    steps: [{run: lint}]
""",
    )
    assert [j.name for j in run.jobs] == [
        "test (linux, 3.12)",
        "test (true, linux, 3.13)",
        "lint mypy",
        "lint ruff",
    ]
    assert [j.job_id for j in run.jobs] == ["test", "test", "named", "named"]
    assert all(j.status == "waiting" for j in run.jobs)


async def test_the_workflow_is_parsed_with_the_runs_github_context(gitea: GiteaDouble) -> None:
    """`InsertRun` inserts the run first, so names and labels may use `github.run_number`,
    and `run-name` becomes the run's title."""
    text = """
run-name: deploy ${{ github.ref_name }} by ${{ github.actor }}
on: push
jobs:
  build:
    name: build ${{ github.run_number }} ${{ matrix.os }}
    runs-on: [self-hosted, "${{ matrix.os }}"]
    strategy: {matrix: {os: pod}}
    steps: [{run: make}]
"""
    gitea.submit("owner/repo", workflow(job("first")))
    run = gitea.submit("owner/repo", text, ref="refs/heads/dev", actor="alice")
    [build] = run.jobs
    assert build.name == "build 2 pod"
    assert build.runs_on == ["self-hosted", "pod"]
    assert run.title == "deploy dev by alice"


async def test_a_job_waits_until_all_its_needs_succeed(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    run = gitea.submit(
        "owner/repo", workflow(job("a"), job("b"), job("c", extra="needs: [a, b]"), job("d", extra="needs: c"))
    )
    assert statuses(gitea, run.id) == {"a": "waiting", "b": "waiting", "c": "blocked", "d": "blocked"}
    assert gitea.run(run.id).status == "waiting"
    assert await finish_next(runner, Result.SUCCESS) == "a"
    assert statuses(gitea, run.id)["c"] == "blocked"
    assert gitea.run(run.id).status == "waiting"
    assert await finish_next(runner, Result.SUCCESS) == "b"
    assert statuses(gitea, run.id)["c"] == "waiting"
    assert await finish_next(runner, Result.SUCCESS) == "c"
    assert await finish_next(runner, Result.SUCCESS) == "d"
    assert (await gitea.wait_run(run.id, timeout_s=5)).status == "success"


async def test_a_failed_need_skips_dependents_without_if_and_the_skip_cascades(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    run = gitea.submit(
        "owner/repo",
        workflow(
            job("build"),
            job("test", extra="needs: build"),
            job("deploy", extra="needs: test"),
            job("report", extra="needs: deploy\nif: always()"),
            job("notify", extra="needs: build\nif: failure()"),
        ),
    )
    assert await finish_next(runner, Result.FAILURE) == "build"
    assert statuses(gitea, run.id) == {
        "build": "failure",
        "test": "skipped",
        "deploy": "skipped",  # cascaded: its need was skipped
        "report": "waiting",  # has `if:`: the runner evaluates it
        "notify": "waiting",
    }
    picked = {await finish_next(runner, Result.SUCCESS), await finish_next(runner, Result.SKIPPED)}
    assert picked == {"report", "notify"}
    assert (await gitea.wait_run(run.id, timeout_s=5)).status == "failure"


async def test_a_cancelled_need_counts_as_not_succeeded(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    run = gitea.submit("owner/repo", workflow(job("build"), job("test", extra="needs: build")))
    await finish_next(runner, Result.CANCELLED)
    assert statuses(gitea, run.id) == {"build": "cancelled", "test": "skipped"}
    assert gitea.run(run.id).status == "cancelled"


async def test_matrix_siblings_gate_their_dependents_together(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    run = gitea.submit(
        "owner/repo",
        workflow(
            job("build", extra="strategy:\n  matrix:\n    n: [1, 2]"),
            job("ship", extra="needs: build"),
        ),
    )
    await finish_next(runner, Result.SUCCESS)
    assert statuses(gitea, run.id)["ship"] == "blocked"
    await finish_next(runner, Result.SUCCESS)
    assert statuses(gitea, run.id)["ship"] == "waiting"


async def test_all_skipped_is_a_skipped_run_and_continue_on_error_does_not_fail_it(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    run = gitea.submit("owner/repo", workflow(job("only")))
    await finish_next(runner, Result.SKIPPED)
    assert gitea.run(run.id).status == "skipped"
    tolerant = gitea.submit("owner/repo", workflow(job("flaky", extra="continue-on-error: true"), job("ok")))
    await finish_next(runner, Result.FAILURE)
    await finish_next(runner, Result.SUCCESS)
    assert gitea.run(tolerant.id).status == "success"


async def test_a_need_failing_with_continue_on_error_counts_as_succeeded(gitea: GiteaDouble) -> None:
    """G-0715's emitter (PR #38100): dependents without `if:` run, and the need's result is
    the aggregate, `success`."""
    runner = await register(gitea)
    run = gitea.submit(
        "owner/repo",
        workflow(job("flaky", extra="continue-on-error: true"), job("after", extra="needs: flaky")),
    )
    assert await finish_next(runner, Result.FAILURE) == "flaky"
    assert statuses(gitea, run.id)["after"] == "waiting"
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    assert fetched.task.needs["flaky"].result is Result.SUCCESS


async def test_endless_tasks_are_stopped_however_often_they_report(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(endless_task_timeout_s=100) as gitea:
        runner = await register(gitea)
        run = gitea.submit("owner/repo", workflow(job("build"), job("after", extra="needs: build")))
        fetched = await runner.fetch_task(0)
        assert fetched.task is not None
        task_id = fetched.task.id
        gitea.advance_clock(99)
        await runner.update_task(TaskState(id=task_id))
        assert gitea.reap_endless_tasks() == []
        gitea.advance_clock(2)
        await runner.update_task(TaskState(id=task_id))
        assert gitea.reap_zombies() == []  # it reports, so it is no zombie
        assert gitea.reap_endless_tasks() == [task_id]
        assert statuses(gitea, run.id) == {"build": "failure", "after": "skipped"}
        assert (await runner.update_task(TaskState(id=task_id))).result is Result.FAILURE


async def test_abandoned_waiting_and_blocked_jobs_are_cancelled(gitea: GiteaDouble) -> None:
    run = gitea.submit("owner/repo", workflow(job("build", runs_on="nobody"), job("after", extra="needs: build")))
    gitea.advance_clock(24 * 3600 - 1)
    assert gitea.cancel_abandoned_jobs() == []
    gitea.advance_clock(2)
    assert sorted(gitea.cancel_abandoned_jobs()) == sorted(j.id for j in run.jobs)
    assert statuses(gitea, run.id) == {"build": "cancelled", "after": "cancelled"}
    assert gitea.run(run.id).status == "cancelled"


async def test_zombie_tasks_are_failed_with_their_steps_and_logs_archived(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(zombie_timeout_s=60) as gitea:
        runner = await register(gitea)
        run = gitea.submit("owner/repo", workflow(job("build", steps=2), job("after", extra="needs: build")))
        fetched = await runner.fetch_task(0)
        assert fetched.task is not None
        task_id = fetched.task.id
        await runner.update_log(task_id, 0, [LogRow(now(), "working")])
        await runner.update_task(TaskState(id=task_id, steps=[StepState(id=0, started_at=now())]))
        gitea.advance_clock(59)
        assert gitea.reap_zombies() == []  # updated within the timeout
        gitea.advance_clock(2)
        assert gitea.reap_zombies() == [task_id]
        task = gitea.task(task_id)
        assert task.status == "failure" and task.stopped > 0
        assert [s.status for s in task.steps] == ["failure", "failure"]
        assert task.log_archived and task.log_rows == ["working"]
        assert statuses(gitea, run.id) == {"build": "failure", "after": "skipped"}
        assert (await runner.update_task(TaskState(id=task_id))).result is Result.FAILURE


async def test_a_zombie_without_any_log_keeps_its_log_unarchived(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(zombie_timeout_s=10) as gitea:
        runner = await register(gitea)
        gitea.submit("owner/repo", workflow(job("build")))
        fetched = await runner.fetch_task(0)
        assert fetched.task is not None
        gitea.advance_clock(11)
        assert gitea.reap_zombies() == [fetched.task.id]
        assert not gitea.task(fetched.task.id).log_archived  # TransferLogs fails: nothing was written


async def test_a_cancelling_zombie_is_cancelled(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(zombie_timeout_s=10) as gitea:
        runner = await register(gitea, capabilities=["cancelling"])
        run = gitea.submit("owner/repo", workflow(job("build")))
        fetched = await runner.fetch_task(0)
        assert fetched.task is not None
        gitea.cancel_run(run.id)
        gitea.advance_clock(11)
        gitea.reap_zombies()
        assert gitea.task(fetched.task.id).status == "cancelled"


async def test_the_reaper_runs_by_itself(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(zombie_timeout_s=1, reap_interval_s=0.05) as gitea:
        runner = await register(gitea)
        run = gitea.submit("owner/repo", workflow(job("build")))
        await runner.fetch_task(0)
        gitea.advance_clock(5)
        assert (await gitea.wait_run(run.id, timeout_s=5)).status == "failure"
