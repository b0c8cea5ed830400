"""The `local` backend: `dynrunner-executor run` as a child process, one directory per job.

Isolation is a fresh directory, HOME and TMPDIR, a clean environment (the controller's own
variables, its registration token among them, never reach the job) and a process group of
its own — enough for development and the demo, not for hostile code.

Threads: reading and writing the few small files of an environment (metadata, pid, exit
status, the assignment) happens on the event loop — a handful of local-file syscalls cost
less than a hop to a worker thread, which also has to win the GIL back from the loop. What
may take long runs in a thread: starting the wrapper, reading all of /proc, and removing a
job's directory (its workspace can be large).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Collection, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dynrunner.controller import contract
from dynrunner.controller.backends.base import (
    BackendError,
    Diagnosis,
    Environment,
    FailureReason,
    Isolation,
    Observation,
    Phase,
    StartEvent,
    StartStage,
    Wake,
)
from dynrunner.controller.backends.local.containment import Cage, Containment, choose
from dynrunner.controller.backends.local.diagnosis import Facts, classify
from dynrunner.controller.backends.local.isolation import Sandbox, unisolated_warning
from dynrunner.controller.backends.local.layout import (
    CREATING,
    DELETING,
    WRAPPER,
    Layout,
    owned_by,
    parse_time,
    remove_tree,
    to_trash,
    trashed,
)
from dynrunner.controller.backends.local.processes import TRACKING_VAR, tracking_id
from dynrunner.controller.backends.local.settings import PASSED_ENV, settings
from dynrunner.controller.backends.local.stopping import Stopper
from dynrunner.controller.backends.local.watch import WATCH_INTERVAL_S, DirectoryWatch
from dynrunner.controller.config.model import ControllerConfig, LocalBackendConfig, PoolConfig
from dynrunner.proto.assignment import Assignment, encode

log = logging.getLogger(__name__)

NAME = "local"
START_POLL_S = 0.05
ORPHAN_AGE_S = 60.0


class LocalBackend:
    name = NAME

    def __init__(
        self,
        pool: str,
        root: Path,
        command: list[str],
        *,
        base_env: Mapping[str, str] | None = None,
        passed_env: tuple[str, ...] = PASSED_ENV,
        deadline_grace: timedelta = timedelta(minutes=1),
        start_grace: timedelta = timedelta(seconds=30),
        containment: Containment | None = None,
        sandbox: Sandbox | None = None,
        config_file: Path | None = None,
    ) -> None:
        """`sandbox`: run jobs isolated as another user (None: as this process's user);
        `config_file`: the controller's configuration, for the warning when they are not."""
        self.pool = pool
        self.root = root
        self.command = command
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._passed_env = passed_env
        self._deadline_grace = deadline_grace
        self._start_grace = start_grace
        self._children: dict[str, int] = {}
        self._removing: set[Path] = set()
        self._stopper = Stopper()
        self._watch: DirectoryWatch | None = None
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.containment = containment or choose("auto", self.root, pool)
        self.sandbox = sandbox
        self._config_file = config_file

    @classmethod
    def from_config(cls, pool: PoolConfig, config: ControllerConfig) -> LocalBackend:
        found = settings(pool, config)
        assert isinstance(pool.backend, LocalBackendConfig)
        return cls(
            pool.name,
            pool.backend.root_dir or Path(),
            found.command,
            passed_env=found.passed_env,
            containment=found.containment,
            sandbox=found.sandbox,
            config_file=found.config_file,
        )

    def isolation(self) -> Isolation:
        """How this backend runs jobs, for the start-up log and `check`."""
        if self.sandbox is None:
            return Isolation(self.containment.describe(), (unisolated_warning(self._config_file),))
        return Isolation(f"{self.containment.describe()}; {self.sandbox.describe()}")

    # -- the Backend protocol --------------------------------------------------------------

    async def create(self, assignment: Assignment, *, stream_seq: int | None = None) -> Environment:
        """The directory with the assignment and the metadata, made aside and renamed into
        place; the executor is started by `follow_start`."""
        layout = self._layout(assignment.assignment_id)
        for _ in range(3):
            env = self._read_env(layout)
            if env is not None:
                return env
            made = self._prepare(layout, assignment, stream_seq)
            if made is not None:
                if self._watch is not None:
                    self._watch.note(assignment.assignment_id)
                return made
        raise BackendError(f"the environment {layout.dir} cannot be made: it keeps appearing half-made")

    async def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:
        """STARTING (the launcher's last line), then — when asked for the next event — the
        wrapper is spawned, once per environment whoever follows, and STARTED once it recorded
        its pid. One started already: STARTED at once, or FAILED when it could never start."""
        layout = self._layout(env.assignment_id)
        if not layout.metadata_file.exists():
            yield StartEvent(StartStage.FAILED, diagnosis=classify(self._facts(env, layout)).diagnosis)
            return
        if layout.started_at() is None:
            yield StartEvent(StartStage.STARTING, f"environment {env.name} created ({NAME}); starting the executor")
            try:
                await asyncio.to_thread(self._claim_and_spawn, layout, env.assignment_id)
            except BackendError as err:
                _write_text(layout.start_error_file, str(err))
                yield StartEvent(StartStage.FAILED, diagnosis=Diagnosis(FailureReason.START_FAILED, str(err)))
                return
        # Spawned (here, or by another follower or a controller before this one): STARTED once
        # the wrapper recorded itself (within milliseconds; at most the start grace).
        while True:
            observation = self._observe(env)
            if observation.phase is not Phase.STARTING:
                if observation.phase.finished and layout.read_int(layout.pid_file) is None:
                    yield StartEvent(StartStage.FAILED, diagnosis=observation.diagnosis)
                else:
                    yield StartEvent(StartStage.STARTED)
                return
            await asyncio.sleep(START_POLL_S)

    async def find(self, assignment_id: str) -> Environment | None:
        return self._read_env(self._layout(assignment_id))

    async def list_owned(self) -> list[Environment]:
        return await asyncio.to_thread(self._list)

    async def observe(self, env: Environment) -> Observation:
        return self._observe(env)

    async def delete(self, env: Environment) -> None:
        layout = self._layout(env.assignment_id)
        pid = layout.read_int(layout.pid_file)
        await self._stop_processes(env.assignment_id, pid, layout)
        self._reap(env.assignment_id, pid)
        trash = to_trash(layout)
        if trash is not None:
            self._removing.add(trash)
            try:
                await asyncio.to_thread(remove_tree, trash)
            except OSError as err:
                log.warning("%s could not be removed yet (%s); orphan collection tries again", trash, err)
            finally:
                self._removing.discard(trash)

    async def collect_orphans(self, launching: Collection[str]) -> list[str]:
        busy = set(launching)
        removed = await asyncio.to_thread(self._collect_orphans, busy)
        removed += await asyncio.to_thread(self._finish_deletions)

        def in_use(name: str) -> bool:
            return name in busy or name in self._children or (self.root / name).exists()

        return removed + await asyncio.to_thread(self.containment.leftovers, in_use)

    async def watch(self, wake: Wake) -> None:
        """One pass over the root every second (`watch.DirectoryWatch`): the reaper is woken for
        each environment that appeared, changed or vanished, and otherwise left alone."""
        watch = self._watch = DirectoryWatch(self.root, self._deadline_grace, self._start_grace, self._alive)
        while True:
            for name in watch.changes(datetime.now(UTC)):
                wake(name)
            await asyncio.sleep(WATCH_INTERVAL_S)

    def _alive(self, assignment_id: str, pid: int) -> bool:
        """Whether `pid` lives (an exited child of ours is reaped first: a zombie is not alive)."""
        self._reap(assignment_id, pid)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    async def aclose(self) -> None:
        """Running executors are left alone (a graceful shutdown never stops jobs); exited
        children are reaped so none lingers as a zombie. Run the controller under an init
        (e.g. tini) when it is PID 1: executors of an earlier run are reparented to it."""
        for assignment_id in list(self._children):
            self._reap(assignment_id)

    # -- helpers ----------------------------------------------------------------------------------

    def _layout(self, assignment_id: str) -> Layout:
        if not assignment_id or "/" in assignment_id or assignment_id.startswith("."):
            raise BackendError(f"assignment id {assignment_id!r} cannot name a directory")
        return Layout(self.root / assignment_id)

    def _read_env(self, layout: Layout) -> Environment | None:
        meta = layout.read_metadata()
        if meta is None or not isinstance(meta.get("labels"), dict):
            return None
        created = parse_time(meta.get("created_at")) or datetime.fromtimestamp(0, UTC)
        return Environment(
            backend=NAME,
            name=str(meta.get("name", layout.dir.name)),
            labels={str(k): str(v) for k, v in meta["labels"].items()},
            created_at=created,
            deadline=parse_time(meta.get("deadline")),
            extra={"path": str(layout.dir)},
        )

    def _prepare(self, layout: Layout, assignment: Assignment, stream_seq: int | None) -> Environment | None:
        """Make the environment aside and rename it into place; None when another create got
        there first (or a half-made directory was in the way, now removed: try again)."""
        if layout.dir.exists() and layout.read_metadata() is None:
            shutil.rmtree(layout.dir, ignore_errors=True)  # a create of an older version, interrupted
        aside = Layout(self.root / f"{CREATING}{layout.dir.name}.{uuid.uuid4().hex[:8]}")
        aside.dir.mkdir(mode=0o700)
        try:
            for sub in (aside.workspace, aside.home, aside.tmp, aside.status_dir, aside.reported_dir):
                sub.mkdir(mode=0o700)
            cage = self.containment.cage(assignment.assignment_id)
            handed = assignment.replace(
                executor=dataclasses.replace(assignment.executor, workspace=str(layout.workspace))
            )
            aside.write_secret(encode(handed))
            if self.sandbox is not None:
                self.sandbox.hand_over(aside)
            now = datetime.now(UTC)
            labels = contract.environment_labels(assignment, stream_seq)
            aside.write_metadata(
                {
                    "name": contract.environment_name(assignment.assignment_id),
                    "labels": labels,
                    "created_at": now.isoformat(),
                    "deadline": assignment.deadline.isoformat() if assignment.deadline else None,
                    "command": self.command,
                    "cage": cage.record(),
                }
            )
            try:
                os.rename(aside.dir, layout.dir)
            except OSError:  # ENOTEMPTY/EEXIST: another create won
                return None
        finally:
            if aside.dir.exists():
                shutil.rmtree(aside.dir, ignore_errors=True)
        return Environment(
            backend=NAME,
            name=contract.environment_name(assignment.assignment_id),
            labels=labels,
            created_at=now,
            deadline=assignment.deadline,
            extra={"path": str(layout.dir)},
        )

    def _claim_and_spawn(self, layout: Layout, assignment_id: str) -> None:
        """Take the start and spawn, in one worker thread: a follower cancelled while the call
        still waits for a thread (a shutdown on a loaded controller) has taken nothing, so the
        next follower starts it; once running, the thread does both."""
        if layout.claim_start():
            self._spawn(layout, assignment_id)

    def _spawn(self, layout: Layout, assignment_id: str) -> None:
        """Start the wrapper in a session of its own (posix_spawn: no Popen object to outlive
        a shutdown that leaves jobs running; exited children are reaped in `_reap`). It
        enters the job's cgroup, made here (not by `create`: see `Cage.make`), before
        anything else; the executor runs inside whatever the containment puts around it (a
        PID namespace)."""
        cage = _cage(layout)
        try:
            cage.make()
        except OSError as err:
            raise BackendError(f"could not make the job's cgroup: {err}") from err
        argv = ["/bin/sh", "-c", WRAPPER, "dynrunner-local", str(layout.dir), cage.join_file]
        if self.sandbox is not None:
            argv += self.sandbox.command_prefix(layout.dir)  # its own PID namespace among them
        elif cage.kind is self.containment.kind:
            argv += self.containment.command_prefix(layout.dir)
        argv += [*self.command, "run", "--assignment", str(layout.assignment_file)]
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(layout.output), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        try:
            pid = os.posix_spawn("/bin/sh", argv, self._child_env(layout), file_actions=actions, setsid=True)
        except OSError as err:
            raise BackendError(f"could not start the executor: {err}") from err
        self._children[assignment_id] = pid
        log.info("started executor pid %s in %s", pid, layout.dir)

    def _reap(self, assignment_id: str, pid: int | None = None) -> None:
        """Collect the exit of our own child, so it does not linger as a zombie. `pid` (from
        the pid file) covers a child started by an earlier backend object of this process."""
        pid = self._children.get(assignment_id, pid)
        if pid is None:
            return
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            self._children.pop(assignment_id, None)

    def _child_env(self, layout: Layout) -> dict[str, str]:
        # The executor starts by absolute path; its steps see the controller's PATH unchanged (the
        # executor's own installation, e.g. a virtualenv's python and pip, must not shadow theirs).
        env = {k: v for k, v in self._base_env.items() if k in self._passed_env}
        env["PATH"] = self._base_env.get("PATH", os.defpath)
        env[TRACKING_VAR] = tracking_id(layout.dir.name)
        env["HOME"] = str(layout.home)
        env["TMPDIR"] = str(layout.tmp)
        env["DYNRUNNER_READY_FILE"] = str(layout.ready_file)
        env["DYNRUNNER_STATE_FILE"] = str(layout.state_file)
        return env

    def _list(self) -> list[Environment]:
        found = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            env = self._read_env(Layout(Path(entry.path)))
            if env is not None and env.labels.get(contract.LABEL_POOL) == self.pool:
                found.append(env)
        return found

    def _facts(self, env: Environment, layout: Layout) -> Facts:
        exists = layout.metadata_file.exists()
        pid = layout.read_int(layout.pid_file)
        self._reap(env.assignment_id, pid)
        # Liveness before the exit status: the wrapper records the status before it exits.
        alive = pid is not None and owned_by(pid, layout)
        executor = None if alive else layout.read_int(layout.executor_pid_file)
        executor_alive = executor is not None and owned_by(executor, layout)
        return Facts(
            exists=exists,
            created_at=env.created_at,
            now=datetime.now(UTC),
            exit_code=layout.read_int(layout.exit_file),
            pid=pid,
            started_at=layout.started_at() if pid is None else None,
            start_error=_read_text(layout.start_error_file) if pid is None else None,
            alive=alive,
            executor_alive=executor_alive,
            deadline=env.deadline,
            deadline_grace=self._deadline_grace,
            start_grace=self._start_grace,
            command=Path(self.command[0]).name,
        )

    def _observe(self, env: Environment) -> Observation:
        layout = self._layout(env.assignment_id)
        facts = self._facts(env, layout)
        observation = dataclasses.replace(classify(facts), ready_at=layout.ready_at())
        if observation.diagnosis is not None and facts.exists:
            tail = layout.output_tail()
            if tail:
                diagnosis = dataclasses.replace(observation.diagnosis, detail=tail)
                observation = dataclasses.replace(observation, diagnosis=diagnosis)
        if observation.phase is Phase.FAILED:
            observation = dataclasses.replace(observation, reported=layout.reported())
        return observation

    async def _stop_processes(self, assignment_id: str, pid: int | None, layout: Layout) -> None:
        """Every process of the environment: the wrapper's group, the executor (it outlives a
        wrapper killed alone), and whatever else the job's cage holds."""
        leader = pid if pid is not None and owned_by(pid, layout) else None
        executor = layout.read_int(layout.executor_pid_file)
        roots = [one for one in (leader, executor) if one is not None and owned_by(one, layout)]
        await self._stopper.stop(
            _cage(layout),
            tracking_id(assignment_id),
            roots,
            leader,
            while_waiting=lambda: self._reap(assignment_id, pid),
            what=str(layout.dir),
        )

    def _collect_orphans(self, launching: set[str]) -> list[str]:
        removed = []
        now = time.time()
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not entry.is_dir() or entry.name in launching or entry.name in self._children:
                continue
            if entry.name.startswith(DELETING):
                continue
            if entry.name.startswith(CREATING):
                if now - entry.stat().st_mtime >= ORPHAN_AGE_S:  # a create that died half-way
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(entry.path)
                continue
            layout = Layout(Path(entry.path))
            if layout.metadata_file.exists() or now - entry.stat().st_mtime < ORPHAN_AGE_S:
                continue
            pid = layout.read_int(layout.pid_file)
            if pid is not None and owned_by(pid, layout):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        return removed

    def _finish_deletions(self) -> list[str]:
        """Directories left in the trash by a deletion that was interrupted (the controller
        died half-way): their environments were already finished, so only removing is left."""
        finished = []
        for path in trashed(self.root):
            if path in self._removing:
                continue
            try:
                remove_tree(path)
            except OSError as err:
                log.warning("%s could not be removed yet: %s", path, err)
                continue
            finished.append(f"{path} (the rest of an interrupted deletion)")
        return finished


def _cage(layout: Layout) -> Cage:
    meta = layout.read_metadata() or {}
    return Cage.from_record(meta.get("cage"))


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def _write_text(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(text + "\n")
