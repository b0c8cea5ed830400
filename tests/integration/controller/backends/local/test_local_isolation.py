"""Jobs under runAsUser: the executor runs as the unprivileged user, reads its own
assignment and writes its own workspace, and cannot read the controller's files (even ones
the host's permissions would let it read), another job's directory or processes; it cannot
regain root. Where isolation is impossible, the backend says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dynrunner.controller.backends.base import Phase
from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.controller.backends.local.isolation import (
    IsolationError,
    Sandbox,
    _outermost,
    resolve_user,
    sandbox,
    unisolated_warning,
)
from dynrunner.controller.backends.local.layout import Layout
from dynrunner.controller.backends.local.settings import SetupError, settings
from dynrunner.controller.config.model import ControllerConfig
from tests.fixtures.harness import wait_for
from tests.fixtures.local_backend import NOBODY, assignment, launch, observe_until
from tests.fixtures.privileges import needs_root

RUN_AS_USER = needs_root("runAsUser runs a job as another user, in namespaces only root may make")
A = "a1b2c3d4-0000-4000-8000-00000000000a"
B = "a1b2c3d4-0000-4000-8000-00000000000b"

PROBE = r"""
for f in "$@"; do
  if [ "$f" = run ] || [ "$f" = --assignment ]; then continue; fi
  if cat "$f" > /dev/null 2> /dev/null; then echo "read $f"; else echo "denied $f"; fi
done
echo made > "$PWD/made-by-job"
ls /proc | grep -c '^[0-9]' > "$HOME/processes"
if sudo -n true 2> /dev/null; then echo root > "$HOME/sudo"; fi
id -u > "$HOME/uid.part" && mv "$HOME/uid.part" "$HOME/uid"  # appears whole, after everything else
while [ ! -e "$HOME/go" ]; do sleep 0.02; done
"""


def controller_files(state: Path) -> dict[str, Path]:
    """What a controller keeps: all readable by anyone on the host, to show that the job is
    kept from them by its namespaces, not by their modes."""
    (state / "nats").mkdir(parents=True)
    files = {
        "sealing key": state / "sealing.key",
        "nats store": state / "nats" / "nats-server.conf",
        "token": state.parent / "registration-token",
        "config": state.parent / "controller.yaml",
    }
    for path in files.values():
        path.write_text("the controller's own\n")
        path.chmod(0o644)
    return files


def isolated(state: Path, files: dict[str, Path], probe_paths: list[Path]) -> LocalBackend:
    root = state / "local" / "local"
    root.mkdir(parents=True)
    box = sandbox(
        resolve_user(str(NOBODY), None),
        controller_paths={state, files["token"]},
        config_file=files["config"],
        root_dir=root,
        executor="/bin/sh",
        store="",
    )
    command = ["/bin/sh", "-c", PROBE, "probe", *map(str, probe_paths)]
    return LocalBackend("local", root, command, base_env={"PATH": os.defpath}, sandbox=box)


def lines(layout: Layout) -> dict[str, str]:
    found = {}
    for line in layout.output.read_text().splitlines():
        verdict, _, path = line.partition(" ")
        if verdict in ("read", "denied"):
            found[path] = verdict
    return found


@RUN_AS_USER
async def test_an_isolated_job_reads_its_own_and_nothing_of_the_controller_or_other_jobs(host_dir: Path) -> None:
    state = host_dir / "state"
    files = controller_files(state)
    root = state / "local" / "local"
    other = Layout(root / B)
    targets = [*files.values(), other.assignment_file, other.workspace / "made-by-job", root / A / "assignment.pb"]
    b = isolated(state, files, targets)
    env_b = await launch(b, assignment(B))
    await wait_for((other.home / "uid").exists, what="job B running")
    env_a = await launch(b, assignment(A))
    mine = Layout(root / A)
    await wait_for((mine.home / "uid").exists, what="job A running")

    verdicts = lines(mine)
    assert verdicts.pop(str(mine.assignment_file)) == "read"  # its own assignment
    assert verdicts == {str(p): "denied" for p in targets if p != mine.assignment_file}, verdicts
    assert (mine.home / "uid").read_text().strip() == str(NOBODY)
    assert (mine.workspace / "made-by-job").stat().st_uid == NOBODY
    # Its /proc shows its own processes only: the namespace's first process, the executor, ls.
    assert int((mine.home / "processes").read_text()) <= 5
    assert not (mine.home / "sudo").exists()
    # The job cannot touch the files the controller trusts.
    assert mine.dir.stat().st_uid == 0 and mine.assignment_file.stat().st_uid == 0
    for job in (mine, other):
        (job.home / "go").touch()
    await observe_until(b, env_a, Phase.SUCCEEDED)
    await observe_until(b, env_b, Phase.SUCCEEDED)
    await b.delete(env_a)
    await b.delete(env_b)
    assert not mine.dir.exists() and not other.dir.exists()


async def test_without_run_as_user_the_same_job_reads_everything_and_the_backend_says_so(host_dir: Path) -> None:
    state = host_dir / "state"
    files = controller_files(state)
    root = state / "local" / "local"
    root.mkdir(parents=True)
    command = ["/bin/sh", "-c", PROBE, "probe", *map(str, files.values())]
    b = LocalBackend("local", root, command, base_env={"PATH": os.defpath}, config_file=files["config"])
    [warning] = b.isolation().warnings
    assert "are not isolated from it" in warning and str(files["config"]) in warning
    env = await launch(b, assignment(A))
    mine = Layout(root / A)
    await wait_for((mine.home / "uid").exists, what="the job running")
    assert lines(mine) == {str(p): "read" for p in [*files.values(), mine.assignment_file]}
    (mine.home / "go").touch()
    await observe_until(b, env, Phase.SUCCEEDED)
    await b.delete(env)


def test_paths_to_hide_are_the_outermost() -> None:
    hidden = _outermost([Path("/var/lib/d/nats"), Path("/var/lib/d"), Path("/etc/d/token"), Path("/"), Path("/etc/d")])
    assert hidden == [Path("/etc/d"), Path("/var/lib/d")]


def test_run_as_user_is_resolved_by_name_or_number_and_never_root() -> None:
    nobody = resolve_user("nobody", None)
    assert (nobody.uid, nobody.gid) == (NOBODY, NOBODY)
    assert resolve_user("61234", None).gid == 61234  # no passwd entry: its own number as group
    assert resolve_user("nobody", "61000").gid == 61000
    with pytest.raises(IsolationError, match="must not be root"):
        resolve_user("0", None)
    with pytest.raises(IsolationError, match="no user"):
        resolve_user("surely-no-such-user", None)


def test_isolation_needs_root_and_says_so(monkeypatch: pytest.MonkeyPatch, host_dir: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(IsolationError, match="needs the controller to run as root"):
        sandbox(
            resolve_user("nobody", None),
            controller_paths=set(),
            config_file=None,
            root_dir=host_dir,
            executor="/bin/sh",
            store="",
        )
    warning = unisolated_warning(Path("/etc/dynrunner.yaml"))
    assert "controller's own user (uid 1000)" in warning and "needs a controller running as root" in warning
    assert "/etc/dynrunner.yaml" in warning


def test_an_executor_the_jobs_cannot_see_is_refused(monkeypatch: pytest.MonkeyPatch, host_dir: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the path is checked before anything needs root
    with pytest.raises(IsolationError, match="jobs must not see"):
        sandbox(
            resolve_user("nobody", None),
            controller_paths={host_dir},
            config_file=None,
            root_dir=host_dir / "root",
            executor=str(host_dir / "venv" / "bin" / "dynrunner-executor"),
            store="",
        )


def test_the_sandbox_is_described(host_dir: Path) -> None:
    box = Sandbox(resolve_user("nobody", None), ("/a", "/b"), "/blank", "", "unshare", "setpriv")
    assert box.describe().startswith("jobs run as nobody (uid 65534, gid 65534) in mount, PID and IPC namespaces")


@RUN_AS_USER
async def test_an_artifact_store_under_a_hidden_path_is_shown_to_the_job(host_dir: Path) -> None:
    state = host_dir / "state"
    files = controller_files(state)
    store = state / "artifacts"
    store.mkdir()
    os.chown(store, NOBODY, NOBODY)
    root = state / "local" / "local"
    root.mkdir(parents=True)
    box = sandbox(
        resolve_user(str(NOBODY), None),
        controller_paths={state},
        config_file=files["config"],
        root_dir=root,
        executor="/bin/sh",
        store=str(store),
    )
    write = f'echo stored > {store}/from-job; cat {files["sealing key"]} > "$HOME/key" 2>&1; echo done > "$HOME/uid"'
    b = LocalBackend("local", root, ["/bin/sh", "-c", write], base_env={"PATH": os.defpath}, sandbox=box)
    env = await launch(b, assignment(A))
    await observe_until(b, env, Phase.SUCCEEDED)
    assert (store / "from-job").read_text() == "stored\n"
    assert (store / "from-job").stat().st_uid == NOBODY
    assert "No such file" in (Layout(root / A).home / "key").read_text()  # the rest of the state stays hidden
    await b.delete(env)


def with_store(host_dir: Path, store: Path) -> ControllerConfig:
    """A pool under runAsUser with a Filesystem artifact store at `store`."""
    return ControllerConfig.model_validate(
        {
            "gitea": {"url": "http://gitea", "registrationToken": "t" * 40},
            "pools": [
                {
                    "name": "local",
                    "labels": ["self-hosted"],
                    "backend": {"kind": "local", "executorCommand": ["/bin/sh"], "runAsUser": "nobody"},
                }
            ],
            "artifacts": {"driver": "Filesystem", "path": str(store)},
            "stateDir": str(host_dir / "state"),
        }
    )


@RUN_AS_USER
def test_a_filesystem_store_is_made_for_the_jobs_user_and_must_be_writable_by_it(host_dir: Path) -> None:
    made = host_dir / "store"
    cfg = with_store(host_dir, made)
    found = settings(cfg.pools[0], cfg)
    assert found.sandbox is not None and found.sandbox.store == str(made)
    assert made.stat().st_uid == NOBODY
    theirs = host_dir / "root-owned"
    theirs.mkdir(mode=0o755)
    cfg = with_store(host_dir, theirs)
    with pytest.raises(SetupError, match="not writable by the jobs' user nobody"):
        settings(cfg.pools[0], cfg)


def test_a_controller_that_is_not_root_refuses_run_as_user_before_it_makes_the_store(
    monkeypatch: pytest.MonkeyPatch, host_dir: Path
) -> None:
    """Not a failed chown of the store to the jobs' user: the reason, and nothing made."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    store = host_dir / "store"
    cfg = with_store(host_dir, store)
    with pytest.raises(SetupError, match=r"runAsUser needs the controller to run as root \(it runs as uid 1000\)"):
        settings(cfg.pools[0], cfg)
    assert not store.exists()
