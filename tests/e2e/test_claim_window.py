"""End to end (real executor): a controller killed right after a claim (issue 14, item 5).

The controller runs as a child process and kills itself (SIGKILL) at a chosen point
(`tests/fixtures/crash_points.py`); then the ordinary `dynrunner-controller run` starts on
the same state. Gitea is the double, NATS a real nats-server.

* Killed once JetStream acknowledged the assignment: the job runs, once. The spent runner
  was still in the registration store; the restarted claim loop arms it again, Gitea gives it
  nothing while its task runs (the other loop claims the next job), and once the task ended
  Gitea deleted the runner and the loop arms another.
* Killed between FetchTask's answer and the publish (the window docs/operations.md
  documents): the claim is lost, Gitea's zombie reaper fails the task, and claiming goes on.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import (
    REAL_EXECUTOR,
    Subprocess,
    assert_only_armed_runners,
    config_data,
    recorded,
    recording_workflow,
    wait_armed,
    wait_for,
    wait_run_done,
)

STARTUP_S = 180
"""A bound on a controller process's cold start (a hang guard): seconds on a quiet machine,
24 s seen at load 12 beside CPU hogs, more at load 30."""


def controller(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> Subprocess:
    data = config_data(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "state",
        nats_url=nats_url,
        nats={"ackWaitSeconds": 3.0},
        executor_command=[REAL_EXECUTOR],
    )
    return Subprocess(data, tmp_path)


def task_of(gitea: GiteaDouble, run_id: int) -> Any:
    [job] = gitea.jobs(run_id)
    return gitea.task(job.task_id) if job.task_id else None


@pytest.mark.timeout(2 * STARTUP_S + 120)  # two cold starts, then the suite's usual 120 s
async def test_killed_after_the_publish_the_job_runs_once_and_the_spent_runner_is_replaced(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.log"
    proc = controller(gitea, nats_url, tmp_path)
    first = gitea.submit("owner/repo", recording_workflow(ran, sleep=3, name="first"))
    try:
        proc.start(crash="after-publish")
        await proc.crashed(within=STARTUP_S)
        spent = task_of(gitea, first.id).runner_id
        proc.start()
        # A cold start (interpreter and imports) took 24 s beside CPU hogs: wait for the
        # restarted controller to run before timing how soon it launches what it recovered.
        await wait_for(lambda: proc.log().count("controller running") == 2, within=STARTUP_S, what="the restart")
        await wait_for(lambda: recorded(ran) == ["first0"], what="the first job running")
        # While the first job runs, its runner is armed again by the restarted loop and gets
        # nothing; the next job goes to the other loop's runner.
        second = gitea.submit("owner/repo", recording_workflow(ran, name="second"))
        await wait_for(lambda: task_of(gitea, second.id), within=10, what="the second job claimed")
        assert task_of(gitea, second.id).runner_id != spent
        assert (await wait_run_done(gitea, first.id)).status == "success"
        assert (await wait_run_done(gitea, second.id)).status == "success"
        spent_name = next(r.name for r in gitea.runners(include_deleted=True) if r.id == spent)
        await wait_for(
            lambda: f"armed runner {spent_name} can no longer claim" in proc.log(),
            within=10,
            what="the spent runner replaced",
        )
        third = gitea.submit("owner/repo", recording_workflow(ran, name="third"))
        assert (await wait_run_done(gitea, third.id)).status == "success"
        await wait_armed(gitea)
        assert await proc.terminate() == 0
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill()
    log = proc.log()
    assert f"reusing armed runner {spent_name} (id {spent})" in log, log[-3000:]
    assert Counter(recorded(ran)) == {"first0": 1, "second0": 1, "third0": 1}
    # The claim loop registered its next runner while publishing: killed before it stored it,
    # the controller left that one never-used runner in Gitea (the Register→store window).
    assert_only_armed_runners(gitea, kills=1)


async def test_killed_between_fetch_and_publish_the_claim_is_lost_until_gitea_reaps_it(
    gitea_factory: Any, nats_url: str, tmp_path: Path
) -> None:
    """The documented window: the task stays running in Gitea with an empty log until the
    zombie reaper fails it (10 minutes in Gitea; 2 s here); the spent runner gets no task
    meanwhile and is replaced once Gitea deleted it with the task."""
    ran = tmp_path / "ran.log"
    async with gitea_factory(zombie_timeout_s=2.0, reap_interval_s=0.5) as gitea:
        proc = controller(gitea, nats_url, tmp_path)
        lost = gitea.submit("owner/repo", recording_workflow(ran, name="lost"))
        try:
            proc.start(crash="after-fetch")
            await proc.crashed()
            task = task_of(gitea, lost.id)
            assert task.status == "running" and task.log_rows == []
            proc.start()
            done = await wait_run_done(gitea, lost.id, within=30)
            assert done.status == "failure"
            assert task_of(gitea, lost.id).log_rows == []
            after = gitea.submit("owner/repo", recording_workflow(ran, name="after"))
            assert (await wait_run_done(gitea, after.id)).status == "success"
            await wait_armed(gitea)
            assert await proc.terminate() == 0
        finally:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.kill()
        assert recorded(ran) == ["after0"]
        assert_only_armed_runners(gitea, kills=1)
