"""The local backend when part of it dies: a wrapper killed on its own, a deletion
interrupted half-way by a controller that was killed."""

from __future__ import annotations

import logging
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.backends.base import Phase
from dynrunner.controller.backends.local.layout import Layout
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.reaping.reaper import PoolWatch, Reaper
from tests.fixtures.harness import wait_for
from tests.fixtures.local_backend import KINDS, alive, assignment, backend, held, launch, observe_until, script


@pytest.mark.parametrize("kind", KINDS)
async def test_the_executor_outlives_its_wrapper_killed_alone(tmp_path: Path, kind: str) -> None:
    cmd = script(tmp_path, 'while [ ! -e "$HOME/go" ]; do sleep 0.02; done; echo finished > "$HOME/done"\n')
    b = backend(tmp_path, cmd, containment=held(kind, tmp_path))
    env = await launch(b, assignment())
    await observe_until(b, env, Phase.RUNNING)
    layout = Layout(b.root / env.assignment_id)
    wrapper = layout.read_int(layout.pid_file)
    assert wrapper is not None
    executor = await wait_for(lambda: children(wrapper), what="the executor started")
    # The wrapper's child records its pid before it execs the executor: the backend knows the
    # executor from then on. Killed before that (a forked child not yet run, on a loaded
    # machine), the wrapper's end is all the backend can see, and it says "vanished".
    await wait_for(lambda: layout.read_int(layout.executor_pid_file), what="the executor recorded its pid")
    os.kill(wrapper, signal.SIGKILL)  # the wrapper alone, not its group
    await wait_for(lambda: not alive(wrapper), what="the wrapper gone")

    assert (await b.observe(env)).phase is Phase.RUNNING  # not "vanished": the executor works on
    (layout.home / "go").touch()
    await wait_for((layout.home / "done").exists, what="the executor finished its job")
    await wait_for(lambda: not alive(executor), what="the executor exited")
    ended = await b.observe(env)
    if kind == "pid-namespace":
        # The namespace's first process, the executor's parent there, recorded the status.
        assert ended.phase is Phase.SUCCEEDED
    else:
        # The status died with the wrapper: the reaper finalizes, which changes nothing for a
        # task the executor finalized (Gitea deleted its runner), and reports one it did not.
        assert ended.phase is Phase.FAILED and ended.diagnosis is not None
        assert "its wrapper was killed" in ended.diagnosis.message
    await b.delete(env)


def children(pid: int) -> int | None:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(found[0]) if found else None


class Killed(BaseException):
    """The controller dying (SIGKILL) in the middle of a call."""


class RecordingGitea:
    def __init__(self) -> None:
        self.calls = 0

    def with_credentials(self, _credentials: Any) -> RecordingGitea:
        return self

    async def update_log(self, *_args: Any, **_kwargs: Any) -> int:
        self.calls += 1
        raise AssertionError("a finished job's task must not be finalized again")


async def test_a_deletion_interrupted_half_way_is_finished_not_misjudged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cmd = script(tmp_path, "exit 0\n")
    b = backend(tmp_path, cmd)
    env = await launch(b, assignment())
    await observe_until(b, env, Phase.SUCCEEDED)
    real_rmtree = shutil.rmtree

    def killed_half_way(path: Any, *args: Any, **kwargs: Any) -> None:
        # As a kill in the middle of the removal leaves it: some files gone, the rest not.
        for name in ("exit-status", "assignment.pb", "pid", "executor-pid", "workspace"):
            target = Path(path) / name
            if target.is_dir():
                real_rmtree(target)
            else:
                target.unlink(missing_ok=True)
        raise Killed

    monkeypatch.setattr(shutil, "rmtree", killed_half_way)
    with pytest.raises(Killed):
        await b.delete(env)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)

    # The controller restarts: its reaper must neither report the job nor misdiagnose it.
    restarted = backend(tmp_path, cmd)
    capacity = Capacity("local", 4)
    metrics = Metrics()
    gitea = RecordingGitea()
    reaper = Reaper([PoolWatch("local", restarted, capacity, lambda: ())], gitea=gitea, metrics=metrics)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO)
    await reaper.sweep(reaper._pools[0])
    assert await restarted.list_owned() == []
    assert gitea.calls == 0
    assert "Gitea will time the task out" not in caplog.text
    assert not metrics.sample("dynrunner_job_results_total", pool="local", result="failed")
    assert not metrics.sample("dynrunner_job_results_total", pool="local", result="vanished")

    await reaper.collect(reaper._pools[0])
    assert "the rest of an interrupted deletion" in caplog.text
    assert list(restarted.root.iterdir()) == []
