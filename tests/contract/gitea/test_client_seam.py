"""The Gitea client seam's contract, on the double (as each release) and on the real release.

What the product's `GiteaClient` relies on, said once and checked on both servers of each
release (`contract_gitea`, tests/fixtures/gitea_contract.py): registering, claiming, the
task's context, the log's ack arithmetic and its archiving, the final report, a user's
cancel. A test that fails on one side only is a divergence of the double (fix it there, with
a test, and list it in docs/compatibility.md) or a wrong reading of Gitea in the product.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
import yaml

from dynrunner.proto.gitea import AlreadyExists, Internal, LogRow, Result, StepState, TaskState, Unauthenticated
from dynrunner.proto.gitea.client import NO_RETRY
from tests.fixtures.gitea_contract import ENDLESS_S, ContractGitea

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def workflow(labels: list[str], steps: int = 2) -> str:
    body = "".join(f"      - name: step{i}\n        run: echo {i}\n" for i in range(steps))
    return f"on: push\njobs:\n  build:\n    runs-on: {json.dumps(labels)}\n    steps:\n{body}"


def rows(*contents: str) -> list[LogRow]:
    return [LogRow(datetime.now(UTC), c) for c in contents]


def final(task_id: int, result: Result, steps: int) -> TaskState:
    now = datetime.now(UTC)
    return TaskState(
        id=task_id,
        result=result,
        started_at=now,
        stopped_at=now,
        steps=[
            StepState(id=i, result=result, started_at=now, stopped_at=now, log_index=i, log_length=1)
            for i in range(steps)
        ],
    )


async def test_a_claimed_task_carries_its_job_and_the_github_context(contract_gitea: ContractGitea) -> None:
    gitea = contract_gitea
    labels = gitea.labels()
    runner = await gitea.register(labels, ephemeral=True)
    claimed = await gitea.claim(runner, workflow(labels))
    task = claimed.task
    payload = yaml.safe_load(task.workflow_payload or b"")
    assert list(payload["jobs"]) == ["build"]
    assert [s["name"] for s in payload["jobs"]["build"]["steps"]] == ["step0", "step1"]
    context = dict(task.context or {})
    assert context["repository"] == claimed.repo
    assert context["server_url"] == gitea.url + "/"
    assert context["api_url"] == gitea.url + "/api/v1"
    assert context["event_name"] == "push" and context["ref"] == "refs/heads/main"
    assert context["run_attempt"] == "1"
    assert context["gitea_default_actions_url"].rstrip("/") == gitea.url
    assert context["token"] == task.secrets["GITHUB_TOKEN"] == task.secrets["GITEA_TOKEN"]
    assert context["gitea_runtime_token"]
    # A spent ephemeral runner gets nothing more while its task runs.
    assert (await runner.fetch_task(0)).task is None


async def test_log_rows_are_acknowledged_by_index_and_kept_once(contract_gitea: ContractGitea) -> None:
    gitea = contract_gitea
    labels = gitea.labels()
    runner = await gitea.register(labels, ephemeral=True)
    claimed = await gitea.claim(runner, workflow(labels))
    task_id = claimed.task.id
    assert await runner.update_log(task_id, 0, rows("a", "b")) == 2
    assert await runner.update_log(task_id, 0, rows("a", "b")) == 2  # a pure resend
    assert await runner.update_log(task_id, 1, rows("b", "c", "d")) == 4  # an overlap: its new tail
    assert await runner.update_log(task_id, 6, rows("x")) == 4  # ahead of the server: told where it is
    assert await runner.update_log(task_id, 4, rows("e"), no_more=True) == 5
    with pytest.raises(AlreadyExists, match="log file has been archived"):
        await runner.update_log(task_id, 5, rows("late"), retry=NO_RETRY)
    await runner.update_task(final(task_id, Result.SUCCESS, 2))
    job = await gitea.job(claimed)
    assert job.status == "success"
    assert job.steps == ["success", "success"]
    assert job.log == ["a", "b", "c", "d", "e"]


async def test_an_empty_no_more_archives_the_log_from_1_26(contract_gitea: ContractGitea) -> None:
    """UpdateLog `no_more` without new rows: 1.24 and 1.25 answer the ack and archive nothing,
    so later rows are still taken; 1.26 (from v1.26.2, go-gitea/gitea#37631) archives."""
    gitea = contract_gitea
    labels = gitea.labels()
    runner = await gitea.register(labels, ephemeral=True)
    claimed = await gitea.claim(runner, workflow(labels, steps=1))
    task_id = claimed.task.id
    assert await runner.update_log(task_id, 0, rows("a")) == 1
    assert await runner.update_log(task_id, 1, [], no_more=True) == 1
    if gitea.release >= "1.26":
        with pytest.raises(AlreadyExists, match="log file has been archived"):
            await runner.update_log(task_id, 1, rows("b"), no_more=True, retry=NO_RETRY)
        assert await runner.update_log(task_id, 0, rows("a"), no_more=True) == 1  # a resent finalize
        expected = ["a"]
    else:
        assert await runner.update_log(task_id, 1, rows("b"), no_more=True) == 2
        expected = ["a", "b"]
    await runner.update_task(final(task_id, Result.SUCCESS, 1))
    assert (await gitea.job(claimed)).log == expected


async def test_the_runtime_token_lives_an_hour_past_the_endless_task_timeout(contract_gitea: ContractGitea) -> None:
    """`gitea_runtime_token` (artifacts, cache) expires 1 h + ENDLESS_TASK_TIMEOUT (30 min on
    both sides here) after the claim, on every release (24 h on 1.24.0-1.24.5)."""
    gitea = contract_gitea
    labels = gitea.labels()
    runner = await gitea.register(labels, ephemeral=True)
    claimed = await gitea.claim(runner, workflow(labels, steps=1))
    token = str((claimed.task.context or {})["gitea_runtime_token"])
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["exp"] - claims["nbf"] == 3600 + ENDLESS_S
    assert claims["TaskID"] == claimed.task.id
    await runner.update_task(final(claimed.task.id, Result.SUCCESS, 1))


async def test_the_final_report_ends_the_job_and_deletes_the_ephemeral_runner(contract_gitea: ContractGitea) -> None:
    gitea = contract_gitea
    labels = gitea.labels()
    runner = await gitea.register(labels, ephemeral=True)
    claimed = await gitea.claim(runner, workflow(labels))
    task_id = claimed.task.id
    names = await gitea.runner_names()
    await runner.update_log(task_id, 0, rows("one", "two"), no_more=True)
    answer = await runner.update_task(final(task_id, Result.FAILURE, 2), outputs={"k": "v"})
    assert answer.result is Result.FAILURE
    assert (await gitea.job(claimed)).status == "failure"
    assert len(await gitea.runner_names()) == len(names) - 1
    with pytest.raises(Unauthenticated, match="unregistered runner"):
        await runner.update_task(TaskState(id=task_id), retry=NO_RETRY)
    with pytest.raises(Unauthenticated, match="unregistered runner"):
        await runner.fetch_task(0)


async def test_a_cancel_ends_the_task_at_once_and_the_runner_is_refused(contract_gitea: ContractGitea) -> None:
    """1.24-1.26 have no `cancelling` state: the cancel ends the task, its job and its
    unfinished steps, and deletes the ephemeral runner although it declared `cancelling`."""
    gitea = contract_gitea
    labels = gitea.labels()
    runner = await gitea.register(labels, ephemeral=True, capabilities=["cancelling"])
    claimed = await gitea.claim(runner, workflow(labels))
    task_id = claimed.task.id
    started = datetime.now(UTC)
    await runner.update_task(TaskState(id=task_id, started_at=started, steps=[StepState(id=0, started_at=started)]))
    assert await runner.update_log(task_id, 0, rows("working")) == 1
    await gitea.cancel(claimed)
    with pytest.raises(Unauthenticated, match="unregistered runner"):
        await runner.update_task(TaskState(id=task_id), retry=NO_RETRY)
    with pytest.raises(Unauthenticated, match="unregistered runner"):
        await runner.update_log(task_id, 1, rows("the last lines"), no_more=True, retry=NO_RETRY)
    job = await gitea.job(claimed)
    assert job.status == "cancelled"
    assert job.steps == ["cancelled", "cancelled"]
    assert job.log == ["working"]


async def test_a_report_on_another_runners_task_is_refused(contract_gitea: ContractGitea) -> None:
    gitea = contract_gitea
    labels = gitea.labels()
    owner = await gitea.register(labels, ephemeral=True)
    claimed = await gitea.claim(owner, workflow(labels))
    other = await gitea.register(gitea.labels())
    with pytest.raises(Internal, match="invalid runner for task"):
        await other.update_task(TaskState(id=claimed.task.id), retry=NO_RETRY)
    with pytest.raises(Internal, match="invalid runner for task"):
        await other.update_log(claimed.task.id, 0, rows("not mine"), retry=NO_RETRY)
    await owner.update_task(final(claimed.task.id, Result.SUCCESS, 2))


async def test_a_finished_job_bumps_no_tasks_version_before_main(contract_gitea: ContractGitea) -> None:
    """1.24-1.26 bump tasks_version when a job becomes waiting, not when one finishes (main
    does while others wait, go-gitea/gitea#38200): a runner sending the version it was given
    is answered on the fast path."""
    gitea = contract_gitea
    labels = gitea.labels()
    runner = await gitea.register(labels)
    two_jobs = (
        workflow(labels, steps=1)
        + f"  other:\n    runs-on: {json.dumps(gitea.labels())}\n    steps:\n      - run: 'true'\n"
    )
    claimed = await gitea.claim(runner, two_jobs)
    version = (await runner.fetch_task(0)).tasks_version  # a scan: "other" is not for this runner
    await runner.update_task(final(claimed.task.id, Result.SUCCESS, 1))
    answer = await runner.fetch_task(version)
    assert answer.task is None and answer.tasks_version == version


async def test_a_runner_an_admin_deleted_is_refused(contract_gitea: ContractGitea) -> None:
    """The claim loop arms another runner on this answer (docs/compatibility.md)."""
    gitea = contract_gitea
    runner = await gitea.register(gitea.labels(), ephemeral=True)
    assert (await runner.fetch_task(0)).task is None
    await gitea.delete_runner(gitea.last_runner)
    with pytest.raises(Unauthenticated, match="unregistered runner"):
        await runner.fetch_task(0)
