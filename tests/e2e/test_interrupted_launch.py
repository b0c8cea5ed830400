"""End to end (real executor): a controller killed between creating a job's environment and
starting its executor resumes the job instead of failing it (issue 14, item 4).

The controller (a child process) kills itself with SIGKILL where the launcher would start
the executor (`tests/fixtures/crash_points.py`, `before-start`): the environment exists,
its executor never ran, the assignment's delivery is unacknowledged. The ordinary
`dynrunner-controller run` then restarts on the same state.

In production the restarted reaper met that environment 30 s after its creation (the local
backend's start grace: no executor yet, so "start-failed") while the redelivery comes only
after `ackWaitSeconds` (60 s) — it finalized the task failed before the job could resume.
Here ack-wait is 4 s, so the environment's creation time is moved 60 s back before the
restart: the same order of events, in seconds. The reaper must leave the environment alone
while JetStream holds its assignment unacknowledged; the redelivery starts the executor.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from dynrunner.controller.backends.local.layout import Layout
from dynrunner.doubles.gitea import GiteaDouble
from tests.e2e.harness import (
    REAL_EXECUTOR,
    Subprocess,
    assert_only_armed_runners,
    config_data,
    recorded,
    recording_workflow,
    wait_for,
    wait_run_done,
)


async def test_a_launch_killed_before_the_executor_started_resumes_and_succeeds_once(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
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
        controller.start(crash="before-start")
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
        assert await controller.terminate() == 0
    finally:
        if controller.proc is not None and controller.proc.poll() is None:
            controller.kill()
    log = controller.log()
    assert done.status == "success", log[-3000:]
    assert recorded(ran) == ["job0"]
    assert "its launch was interrupted; leaving it to the assignment's redelivery" in log
    assert "[start-failed]" not in log
    assert_only_armed_runners(gitea, kills=1)
