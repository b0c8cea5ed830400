"""End to end (real executor): a controller killed (SIGKILL) twice mid-run loses nothing and runs nothing twice.

The controller runs as `dynrunner-controller run --config FILE` in a child process, against
the Gitea double (in this test's process) and a real nats-server. Executors run in their
own sessions, so they outlive the controller; the restarted controller recovers the
environments, the queued assignments and the armed registration.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import (
    REAL_EXECUTOR,
    Subprocess,
    assert_only_armed_runners,
    config_data,
    recorded,
    recording_workflow,
    wait_for,
    wait_run_done,
)

JOBS = 8


async def test_controller_killed_mid_run_loses_nothing_and_duplicates_nothing(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    ran = tmp_path / "ran.log"
    data = config_data(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=state,
        nats_url=nats_url,
        max_concurrency=3,
        nats={"ackWaitSeconds": 2.0},
        executor_command=[REAL_EXECUTOR],
    )
    controller = Subprocess(data, tmp_path)
    run = gitea.submit("owner/repo", recording_workflow(ran, JOBS, sleep=0.8))
    try:
        controller.start()
        for started in (2, 5):
            await wait_for(lambda n=started: len(recorded(ran)) >= n, within=60, what=f"{started} jobs started")
            controller.kill()
            controller.start()
        done = await wait_run_done(gitea, run.id, within=90)
        root = state / "local" / "local"
        await wait_for(lambda: not any(root.iterdir()), within=30, what="every environment reaped")
        assert await controller.terminate() == 0
    finally:
        if controller.proc is not None and controller.proc.poll() is None:
            controller.kill()
    assert done.status == "success", controller.log()[-3000:]
    assert sorted(j.status for j in done.jobs) == ["success"] * JOBS
    counts = Counter(recorded(ran))
    assert len(counts) == JOBS, counts
    assert max(counts.values()) == 1, f"a task ran twice: {counts}"
    # One armed runner for the next claim; every spent one was deleted by Gitea.
    assert_only_armed_runners(gitea)
