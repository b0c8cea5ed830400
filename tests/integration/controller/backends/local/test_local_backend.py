"""The local backend with real child processes: create, find, observe, recover, delete."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dynrunner.controller import contract
from dynrunner.controller.backends.base import FailureReason, Phase, StartEvent, StartStage
from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.controller.backends.local.layout import Layout
from dynrunner.controller.backends.local.settings import PASSED_ENV, S3_ENV
from dynrunner.proto.assignment import decode
from tests.fixtures.harness import wait_for
from tests.fixtures.local_backend import (
    KINDS,
    alive,
    assignment,
    backend,
    held,
    launch,
    observe_until,
    script,
    sleepers,
)


async def test_lifecycle_of_a_successful_executor(tmp_path: Path) -> None:
    cmd = script(tmp_path, 'echo "args: $*"; env > "$HOME/env.txt"; pwd > "$HOME/cwd.txt"; exit 0\n')
    b = backend(tmp_path, cmd)
    a = assignment()
    env = await b.create(a)
    layout = Layout(b.root / a.assignment_id)
    assert layout.assignment_file.exists() and not layout.pid_file.exists()  # created, not started
    events = b.follow_start(env)
    starting = await anext(events)
    assert starting == StartEvent(StartStage.STARTING, f"environment {env.name} created (local); starting the executor")
    assert not layout.pid_file.exists() and not layout.start_file.exists()  # not before the next event is asked
    started = await anext(events)
    assert started.stage is StartStage.STARTED
    assert [e async for e in events] == []
    assert env.name == contract.environment_name(a.assignment_id)
    assert env.labels == contract.environment_labels(a)
    assert (await b.find(a.assignment_id)) == env
    assert [e.assignment_id for e in await b.list_owned()] == [a.assignment_id]
    obs = await observe_until(b, env, Phase.SUCCEEDED)
    assert obs.exit_code == 0

    handed = decode(layout.assignment_file.read_bytes())
    assert stat.S_IMODE(layout.assignment_file.stat().st_mode) == 0o600
    assert handed.task.secrets == {"K": "secret"} and handed.runner.token == "rt"
    assert handed.executor.workspace == str(layout.workspace)
    assert (layout.home / "cwd.txt").read_text().strip() == str(layout.workspace)
    child_env = (layout.home / "env.txt").read_text()
    assert "SECRET_OF_CONTROLLER" not in child_env
    assert f"HOME={layout.home}" in child_env and f"TMPDIR={layout.tmp}" in child_env
    assert f"run --assignment {layout.assignment_file}" in layout.output.read_text()

    await b.delete(env)
    assert not layout.dir.exists()
    assert await b.find(a.assignment_id) is None
    await b.delete(env)  # deleting what is gone is success
    await b.aclose()


async def test_create_is_idempotent(tmp_path: Path) -> None:
    cmd = script(tmp_path, 'echo start >> "$HOME/../../starts"; sleep 0.3\n')
    b = backend(tmp_path, cmd)
    a = assignment()
    first = await b.create(a)
    second = await b.create(a)
    assert first == second
    for followed in (first, second, first):  # every follower: one start
        assert [e.stage async for e in b.follow_start(followed)][-1] is StartStage.STARTED
    await observe_until(b, first, Phase.SUCCEEDED)
    assert (b.root / "starts").read_text().count("start") == 1
    await b.delete(first)


async def test_failed_executor_is_diagnosed_with_its_output(tmp_path: Path) -> None:
    b = backend(tmp_path, script(tmp_path, "echo 'cannot parse payload' >&2; exit 3\n"))
    env = await launch(b, assignment())
    obs = await observe_until(b, env, Phase.FAILED)
    diagnosis = obs.diagnosis
    assert diagnosis is not None
    assert diagnosis.reason is FailureReason.EXECUTOR_FAILED
    assert "status 3" in diagnosis.message
    assert "cannot parse payload" in diagnosis.detail
    await b.delete(env)


async def test_missing_program_is_a_start_failure(tmp_path: Path) -> None:
    b = backend(tmp_path, [str(tmp_path / "no-such-executor")])
    env = await launch(b, assignment())
    obs = await observe_until(b, env, Phase.FAILED)
    assert obs.diagnosis is not None and obs.diagnosis.reason is FailureReason.START_FAILED
    await b.delete(env)


async def test_state_survives_a_controller_restart(tmp_path: Path) -> None:
    cmd = script(tmp_path, "sleep 0.5; exit 0\n")
    first = backend(tmp_path, cmd)
    env = await launch(first, assignment())
    # A new backend object (a restarted controller) is not the parent of the process.
    second = backend(tmp_path, cmd)
    [found] = await second.list_owned()
    assert found == env
    await observe_until(second, found, Phase.RUNNING)
    obs = await observe_until(second, found, Phase.SUCCEEDED)
    assert obs.exit_code == 0
    await second.delete(found)
    await first.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_delete_stops_the_whole_process_group(tmp_path: Path, kind: str) -> None:
    n = random.randrange(10**8, 10**9)
    b = backend(tmp_path, script(tmp_path, f"sleep {n} & wait\n"), containment=held(kind, tmp_path))
    env = await launch(b, assignment())
    await observe_until(b, env, Phase.RUNNING)
    layout = Layout(b.root / env.assignment_id)
    [grandchild] = await wait_for(lambda: sleepers(n), what="the executor's child")
    await b.delete(env)
    assert not layout.dir.exists()
    await wait_for(lambda: not alive(grandchild), what="grandchild gone")


async def test_a_killed_wrapper_is_vanished(tmp_path: Path) -> None:
    b = backend(tmp_path, script(tmp_path, "sleep 300\n"))
    env = await launch(b, assignment())
    await observe_until(b, env, Phase.RUNNING)
    layout = Layout(b.root / env.assignment_id)
    pid = layout.read_int(layout.pid_file)
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    obs = await observe_until(b, env, Phase.FAILED)
    assert obs.diagnosis is not None and obs.diagnosis.reason is FailureReason.VANISHED
    await b.delete(env)


async def test_deadline_exceeded(tmp_path: Path) -> None:
    b = backend(tmp_path, script(tmp_path, "sleep 300\n"), deadline_grace=timedelta(seconds=0))
    env = await launch(b, assignment(deadline=datetime.now(UTC) - timedelta(seconds=1)))
    obs = await observe_until(b, env, Phase.FAILED)
    assert obs.diagnosis is not None and obs.diagnosis.reason is FailureReason.DEADLINE_EXCEEDED
    await b.delete(env)


async def test_a_create_interrupted_before_the_start_is_resumed(tmp_path: Path) -> None:
    cmd = script(tmp_path, 'echo start >> "$HOME/../../starts"\n')
    b = backend(tmp_path, cmd)
    a = assignment()
    created = await b.create(a)  # the crash came after the environment was made, before its start
    restarted = backend(tmp_path, cmd)
    env = await restarted.create(a)
    assert env == created
    stages = [e.stage async for e in restarted.follow_start(env)]
    assert stages == [StartStage.STARTING, StartStage.STARTED]
    await observe_until(restarted, env, Phase.SUCCEEDED)
    assert (restarted.root / "starts").read_text().count("start") == 1
    await restarted.delete(env)


async def test_a_start_stopped_while_its_spawn_waits_for_a_thread_is_started_by_the_next_follower(
    tmp_path: Path,
) -> None:
    """A controller stopped (its follower cancelled) while the executor's spawn still waits for
    a worker thread — all of them busy on a loaded controller — must leave the start untaken:
    the next controller's follower starts it, instead of finding it taken, waiting out the
    start grace and failing the job as start-failed."""
    cmd = script(tmp_path, 'echo start >> "$HOME/../../starts"\n')
    b = backend(tmp_path, cmd, start_grace=timedelta(seconds=1))
    a = assignment()
    env = await b.create(a)
    loop = asyncio.get_running_loop()
    busy = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as workers:
        loop.set_default_executor(workers)
        blocker = loop.run_in_executor(None, busy.wait)  # the only thread is taken
        events = b.follow_start(env)
        assert (await anext(events)).stage is StartStage.STARTING
        spawning = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.1)  # the spawn is queued behind the blocker
        assert not spawning.done()
        spawning.cancel()  # the controller stops
        with contextlib.suppress(asyncio.CancelledError):
            await spawning
        await events.aclose()
        busy.set()
        await blocker

        restarted = backend(tmp_path, cmd, start_grace=timedelta(seconds=1))
        stages = [e.stage async for e in restarted.follow_start(env)]
        assert stages == [StartStage.STARTING, StartStage.STARTED]
        await observe_until(restarted, env, Phase.SUCCEEDED)
        assert (restarted.root / "starts").read_text().count("start") == 1
        await restarted.delete(env)


async def test_orphans_are_collected(tmp_path: Path) -> None:
    b = backend(tmp_path, script(tmp_path, "exit 0\n"))
    orphan = b.root / "half-made"
    orphan.mkdir()
    young = b.root / "being-made"
    young.mkdir()
    old = time.time() - 3600
    os.utime(orphan, (old, old))
    assert await b.collect_orphans(launching=set()) == [str(orphan)]
    assert young.exists() and not orphan.exists()


async def test_the_assignments_stream_sequence_is_recorded_with_the_environment(tmp_path: Path) -> None:
    """The launcher passes the delivery's stream sequence; a restarted controller reads it back
    (the reaper asks JetStream whether that message is still unacknowledged)."""
    b = backend(tmp_path, script(tmp_path, "exit 0\n"))
    env = await launch(b, assignment(), stream_seq=42)
    assert env.stream_seq == 42 and env.labels["dynrunner.io/stream-seq"] == "42"
    [found] = await backend(tmp_path, ["/bin/true"]).list_owned()
    assert found.stream_seq == 42
    await b.delete(env)
    unrecorded = await launch(b, assignment("a1b2c3d4-0000-4000-8000-000000000002"))
    assert unrecorded.stream_seq is None and "dynrunner.io/stream-seq" not in unrecorded.labels
    await b.delete(unrecorded)


def test_unknown_program_fails_at_configuration(tmp_path: Path) -> None:
    from dynrunner.controller.backends.local.settings import resolve_program

    with pytest.raises(ValueError, match="not found"):
        resolve_program("surely-not-a-dynrunner-program", os.defpath)


@pytest.mark.parametrize("kind", KINDS)
async def test_delete_stops_what_a_job_left_running_in_other_sessions(tmp_path: Path, kind: str) -> None:
    """Steps run in sessions of their own and may leave daemons behind: the tracking id finds
    them even without a cgroup or a PID namespace."""
    n = random.randrange(10**8, 10**9)
    cmd = script(tmp_path, f"setsid sleep {n} > /dev/null 2>&1 &\nsleep 0.3\n")
    b = backend(tmp_path, cmd, containment=held(kind, tmp_path))
    env = await launch(b, assignment())
    [orphan] = await wait_for(lambda: sleepers(n), what="the orphan started")
    await observe_until(b, env, Phase.SUCCEEDED)
    await b.delete(env)
    await wait_for(lambda: not alive(orphan), what="the orphan stopped")


async def test_executor_environment_is_small_and_keeps_path(tmp_path: Path) -> None:
    """PATH reaches the executor as the controller has it (not prefixed with the executor's own
    installation); AWS credentials pass only when the artifact store is S3."""
    cmd = script(tmp_path, 'env > "$HOME/env.txt"\n')
    base = {"PATH": "/opt/tools/bin:/usr/bin:/bin", "AWS_SECRET_ACCESS_KEY": "s3-secret", "GITEA_TOKEN_X": "no"}

    async def child_env(passed: tuple[str, ...], aid: str) -> str:
        b = LocalBackend("local", tmp_path / "root", cmd, base_env=base, passed_env=passed)
        env = await launch(b, assignment(aid))
        await observe_until(b, env, Phase.SUCCEEDED)
        text = (Layout(b.root / aid).home / "env.txt").read_text()
        await b.delete(env)
        await b.aclose()
        return text

    plain = await child_env(PASSED_ENV, "a1b2c3d4-0000-4000-8000-00000000000a")
    assert "PATH=/opt/tools/bin:/usr/bin:/bin\n" in plain
    assert "AWS_SECRET_ACCESS_KEY" not in plain and "GITEA_TOKEN_X" not in plain
    with_s3 = await child_env(PASSED_ENV + S3_ENV, "a1b2c3d4-0000-4000-8000-00000000000b")
    assert "AWS_SECRET_ACCESS_KEY=s3-secret" in with_s3 and "GITEA_TOKEN_X" not in with_s3


def test_from_config_passes_s3_credentials_and_makes_a_filesystem_store(tmp_path: Path) -> None:
    from dynrunner.controller.config.model import ControllerConfig

    def cfg(artifacts: dict[str, str]) -> ControllerConfig:
        return ControllerConfig.model_validate(
            {
                "gitea": {"url": "http://gitea", "registrationToken": "t" * 40},
                "pools": [
                    {
                        "name": "local",
                        "labels": ["self-hosted"],
                        "backend": {"kind": "local", "executorCommand": ["/bin/sh"]},
                    }
                ],
                "artifacts": artifacts,
                "stateDir": str(tmp_path / "state"),
            }
        )

    store = tmp_path / "store" / "nested"
    fs = cfg({"driver": "Filesystem", "path": str(store)})
    assert "AWS_SECRET_ACCESS_KEY" not in LocalBackend.from_config(fs.pools[0], fs)._passed_env
    assert store.is_dir()
    s3 = cfg({"driver": "S3", "bucket": "b"})
    assert "AWS_SECRET_ACCESS_KEY" in LocalBackend.from_config(s3.pools[0], s3)._passed_env
