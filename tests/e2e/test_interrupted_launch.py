"""End to end (real executor): a controller killed between creating a job's environment and
starting its executor resumes the job instead of failing it (issue 14, item 4; issue 9's
handshake).

The controller (a child process) kills itself with SIGKILL (`tests/fixtures/crash_points.py`)
either right after creating the environment, before acknowledging its delivery
(`before-ack`), or once the delivery is acknowledged and the start follower is about to let
the executor start (`before-start`): the environment exists, its executor never ran. The
ordinary `dynrunner-controller run` then restarts on the same state: its reaper finds the
environment still starting and follows its start again, which starts the executor; a
redelivery of an unacknowledged assignment finds the environment and starts nothing twice.

The environment's creation time is moved 60 s back before the restart: a start nobody took
is waited for (until the job's deadline), not declared failed after the start grace.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dynrunner.controller.backends.local.layout import Layout
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


@pytest.mark.parametrize("crash", ["before-ack", "before-start"])
async def test_a_launch_killed_before_the_executor_started_resumes_and_succeeds_once(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, crash: str
) -> None:
    ran = tmp_path / "ran.log"
    state = tmp_path / "state"
    data = config_data(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=state,
        nats_url=nats_url,
        nats={"ackWaitSeconds": 4.0},
        executor_command=[REAL_EXECUTOR],
    )
    controller = Subprocess(data, tmp_path)
    run = gitea.submit("owner/repo", recording_workflow(ran))
    try:
        controller.start(crash=crash)
        await controller.crashed()
        [env_dir] = (state / "local" / "local").iterdir()
        layout = Layout(env_dir)
        assert not layout.pid_file.exists() and recorded(ran) == []  # created, never started
        meta = layout.read_metadata()
        assert meta is not None and meta["labels"]["dynrunner.io/stream-seq"].isdigit()
        meta.pop("version")
        meta["created_at"] = (datetime.now(UTC) - timedelta(seconds=60)).isoformat()
        layout.write_metadata(meta)

        controller.start()
        done = await wait_run_done(gitea, run.id, within=60)
        await wait_for(lambda: not env_dir.exists(), within=30, what="the environment reaped")
        await wait_armed(gitea)
        assert await controller.terminate() == 0
    finally:
        if controller.proc is not None and controller.proc.poll() is None:
            controller.kill()
    log = controller.log()
    assert done.status == "success", log[-3000:]
    assert recorded(ran) == ["job0"]
    assert "[start-failed]" not in log
    assert log.count("started executor pid") == 1, log[-3000:]
    assert_only_armed_runners(gitea, kills=1)
