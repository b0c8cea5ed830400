"""No process of a job outlives it: daemons that leave the job's process tree and drop its
RUNNER_TRACKING_ID are held by the job's cgroup (v2 or v1) or PID namespace, and stopped
with it. Each escape technique against each containment this machine offers."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dynrunner.controller.backends.base import Phase
from dynrunner.controller.backends.local import containment
from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.controller.backends.local.containment import PREFERENCE, Cage, Containment, Kind, choose
from dynrunner.controller.backends.local.isolation import resolve_user, sandbox
from dynrunner.controller.backends.local.layout import Layout
from tests.fixtures.harness import wait_for
from tests.fixtures.local_backend import (
    NOBODY,
    assignment,
    backend,
    held,
    launch,
    observe_until,
    script,
    sleepers,
)
from tests.fixtures.privileges import needs_root

ESCAPES = {
    # a new session with an empty environment: no tracking id, no process group
    "env -i setsid": "env -i /usr/bin/setsid /bin/sleep {n} > /dev/null 2>&1 &",
    # a double fork: re-parented to init, without the tracking id
    "double fork": "env -u RUNNER_TRACKING_ID /bin/sh -c '/bin/sh -c \"/bin/sleep {n} > /dev/null 2>&1 &\" &'",
    # sudo resets the environment (env_reset) and runs as another user; its child detaches
    "sudo": "sudo -u nobody /bin/sh -c '/bin/sleep {n} > /dev/null 2>&1 &'",
}
HELD = ("cgroup-v2", "cgroup-v1", "pid-namespace")


@pytest.mark.parametrize("kind", HELD)
@pytest.mark.parametrize("technique", sorted(ESCAPES))
async def test_no_daemon_outlives_its_job(tmp_path: Path, kind: str, technique: str) -> None:
    if technique == "sudo" and shutil.which("sudo") is None:
        pytest.skip("sudo is not installed")
    n = random.randrange(10**8, 10**9)
    body = ESCAPES[technique].format(n=n) + '\nwhile [ ! -e "$HOME/go" ]; do sleep 0.02; done\nexit 0\n'
    b = backend(tmp_path, script(tmp_path, body), containment=held(kind, tmp_path))
    assert b.containment.kind is Kind(kind)
    env = await launch(b, assignment())
    daemons = await wait_for(lambda: sleepers(n), what="the daemon started")
    tracked = f"RUNNER_TRACKING_ID=dynrunner_{env.assignment_id}".encode()
    assert not any(carries(pid, tracked) for pid in daemons)
    (Layout(b.root / env.assignment_id).home / "go").touch()
    await observe_until(b, env, Phase.SUCCEEDED)
    await b.delete(env)
    await wait_for(lambda: not sleepers(n), within=5, what="the daemon stopped with its job")
    assert not b.root.exists() or list(b.root.iterdir()) == []
    if b.containment.parent is not None:
        assert not b.containment.parent.exists(), "the job's cgroup was left behind"


def test_auto_chooses_the_first_available_in_order_and_says_which(tmp_path: Path) -> None:
    available = []
    for kind in PREFERENCE:
        try:
            available.append(choose(kind.value, tmp_path / "root", "local").kind)
        except ValueError:
            continue
    chosen = choose("auto", tmp_path / "root", "local")
    assert chosen.kind is available[0]
    assert chosen.describe().startswith(f"processes contained by {chosen.kind.value}")
    assert "best effort" in choose("process-scan", tmp_path / "root", "local").describe()


def carries(pid: int, variable: bytes) -> bool:
    return variable in Path(f"/proc/{pid}/environ").read_bytes()


async def test_a_job_cgroup_without_its_environment_is_collected(tmp_path: Path) -> None:
    cgroup = held("cgroup-v2", tmp_path)
    n = random.randrange(10**8, 10**9)
    b = backend(tmp_path, script(tmp_path, f"/bin/sleep {n}\n"), containment=cgroup)
    env = await launch(b, assignment())
    await wait_for(lambda: sleepers(n), what="the job's process started")
    # Its directory went without its processes being stopped; the controller restarts:
    # orphan collection stops them through the cgroup.
    shutil.rmtree(b.root / env.assignment_id)
    restarted = backend(tmp_path, script(tmp_path, "exit 0\n"), containment=cgroup)
    removed = await restarted.collect_orphans(launching=set())
    assert any("the cgroup of a job that is gone" in line for line in removed), removed
    await wait_for(lambda: not sleepers(n), within=5, what="the orphaned cgroup's process stopped")
    await b.aclose()


@dataclass(frozen=True)
class Interleaved(Containment):
    """A containment whose launches pause while another replica (a backend of its own on the
    same root, on a loop and thread of its own, as another process) collects orphans: when
    `create` takes the job's cage, before the directory is renamed into place, and when the
    start builds the wrapper's command, right before the spawn."""

    other: LocalBackend | None = None
    collected: list[str] = field(default_factory=list)

    def cage(self, assignment_id: str) -> Cage:
        found = super().cage(assignment_id)
        self._meanwhile()
        return found

    def command_prefix(self, job_dir: Path) -> list[str]:
        self._meanwhile()
        return super().command_prefix(job_dir)

    def _meanwhile(self) -> None:
        assert self.other is not None
        with ThreadPoolExecutor(1) as thread:
            self.collected.extend(thread.submit(asyncio.run, self.other.collect_orphans([])).result())


@pytest.mark.parametrize("kind", ["cgroup-v2", "cgroup-v1"])
async def test_another_replicas_orphan_collection_leaves_a_launch_in_progress_alone(tmp_path: Path, kind: str) -> None:
    """Replicas share the pool's root and its cgroups; one collects orphans while another is
    half-way through a launch (it knows nothing of that launch): the job still starts in its
    own cgroup, and nothing of it is collected."""
    command = script(tmp_path, 'cat /proc/self/cgroup > "$HOME/cgroups"\n')
    cage = held(kind, tmp_path)
    other = backend(tmp_path, command, containment=cage)
    interleaved = Interleaved(cage.kind, cage.parent, cage.unshare, cage.passed_over, other=other)
    b = backend(tmp_path, command, containment=interleaved)
    env = await launch(b, assignment())
    layout = Layout(b.root / env.assignment_id)
    await wait_for(layout.exit_file.exists, what="the job ended")
    observed = await b.observe(env)
    assert observed.phase is Phase.SUCCEEDED, observed.diagnosis
    assert interleaved.collected == []
    cgroups = (layout.home / "cgroups").read_text()
    assert f"/{env.assignment_id}\n" in cgroups, cgroups
    await b.delete(env)
    assert cage.parent is not None and not cage.parent.exists(), "the job's cgroup was left behind"


@pytest.mark.parametrize("kind", ["cgroup-v2", "cgroup-v1"])
def test_orphan_collection_leaves_another_processs_probe_alone(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller starting (or `check`) probes the pool's cgroup with a process moved into a
    cgroup of its own there, while a replica serving the pool collects orphans: the probe's
    cgroup is no job's leftover, and the probe finds the containment available."""
    serving = backend(tmp_path, script(tmp_path, "exit 0\n"), containment=held(kind, tmp_path))
    collected: list[str] = []
    real = containment.probe

    def collected_meanwhile(argv: list[str]) -> str:
        collected.extend(asyncio.run(serving.collect_orphans([])))
        return real(argv)

    monkeypatch.setattr(containment, "probe", collected_meanwhile)
    assert choose(kind, tmp_path / "root", "local").kind is Kind(kind)
    assert collected == []
    assert serving.containment.parent is not None and not serving.containment.parent.exists()


@pytest.mark.parametrize("kind", ["cgroup-v2", "cgroup-v1"])
async def test_the_cgroup_of_a_probe_killed_long_ago_is_collected(tmp_path: Path, kind: str) -> None:
    """A controller killed during its probe leaves the probe's cgroup; a minute later it is a
    leftover, and the pool's cgroup goes with it."""
    b = backend(tmp_path, script(tmp_path, "exit 0\n"), containment=held(kind, tmp_path))
    assert b.containment.parent is not None
    left = b.containment.parent / f"{containment.PROBE}4194304"
    left.mkdir(parents=True)
    assert await b.collect_orphans([]) == [], "a probe in progress was collected"
    long_ago = time.time() - containment.PROBE_AGE_S - 1
    os.utime(left, (long_ago, long_ago))
    assert await b.collect_orphans([]) == [f"{left} (the cgroup of an interrupted probe)"]
    assert not b.containment.parent.exists()


LEAVE_THE_CGROUP = r"""
env -u RUNNER_TRACKING_ID /usr/bin/setsid /bin/sleep {n} > /dev/null 2>&1 &
daemon=$!
for procs in $(find /sys/fs/cgroup -maxdepth 3 -name cgroup.procs 2> /dev/null); do
  if echo "$daemon" > "$procs" 2> /dev/null; then echo "$procs" >> "$HOME/moved"; fi
done
touch "$HOME/tried"
while [ ! -e "$HOME/go" ]; do sleep 0.02; done
"""


@pytest.mark.parametrize("kind", ["cgroup-v2", "cgroup-v1"])
@pytest.mark.parametrize(
    "run_as_user",
    [
        pytest.param(True, id="runAsUser", marks=needs_root("runAsUser runs the job as another user")),
        pytest.param(False, id="as-root", marks=needs_root("the job runs as root, as a root controller's do")),
    ],
)
async def test_a_job_moving_a_daemon_to_another_cgroup_escapes_only_as_root(
    host_dir: Path, kind: str, run_as_user: bool
) -> None:
    """A job writes its daemon's pid (a new session, without the tracking id: only the cgroup
    holds it) into every `cgroup.procs` it finds. Under runAsUser none
    takes it, and the daemon dies with the job; a job that runs as root (no runAsUser, root
    controller) moves it out and it survives — as docs/backends.md says: containment holds
    against a hostile job only under runAsUser."""
    n = random.randrange(10**8, 10**9)
    root = host_dir / "state" / "local" / "local"
    root.mkdir(parents=True)
    command = ["/bin/sh", "-c", LEAVE_THE_CGROUP.format(n=n), "job"]
    box = None
    if run_as_user:
        box = sandbox(
            resolve_user(str(NOBODY), None),
            controller_paths={host_dir / "state"},
            config_file=None,
            root_dir=root,
            executor="/bin/sh",
            store="",
        )
    cage = held(kind, host_dir)
    b = LocalBackend("local", root, command, base_env={"PATH": os.defpath}, containment=cage, sandbox=box)
    env = await launch(b, assignment())
    layout = Layout(root / env.assignment_id)
    await wait_for((layout.home / "tried").exists, what="the job tried to leave its cgroup")
    moved = (layout.home / "moved").read_text().split() if (layout.home / "moved").exists() else []
    (layout.home / "go").touch()
    await observe_until(b, env, Phase.SUCCEEDED)
    await b.delete(env)
    try:
        if run_as_user:
            assert moved == []
            await wait_for(lambda: not sleepers(n), within=5, what="the daemon stopped with its job")
        else:
            assert moved, "a root job could not move its daemon: the limitation docs/backends.md states is gone"
            assert sleepers(n), "the daemon a root job moved out was stopped after all"
    finally:
        for pid in sleepers(n):
            os.kill(pid, signal.SIGKILL)
