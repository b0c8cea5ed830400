"""The double's server logic, one synchronous method per operation.

Methods are called from worker threads (RPCs) or from the test's thread (the Python API);
every state change is a SQLite write transaction. The RPC layer (`service.py`) only maps
protobuf to these calls and shapes errors.
"""

from __future__ import annotations

import dataclasses
import json
import secrets as pysecrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dynrunner.doubles.gitea import logs, runs, tasks
from dynrunner.doubles.gitea import runners as runner_db
from dynrunner.doubles.gitea.costs import Costs
from dynrunner.doubles.gitea.errors import NOT_EXIST, PlainError, internal, unauthenticated
from dynrunner.doubles.gitea.gitrepos import GitRepositories
from dynrunner.doubles.gitea.jobparser import parse_workflow
from dynrunner.doubles.gitea.payload import Instance, build_task, parse_context
from dynrunner.doubles.gitea.profiles import DEFAULT_PROFILE, Profile, profile
from dynrunner.doubles.gitea.repos import Repositories
from dynrunner.doubles.gitea.status import Status
from dynrunner.doubles.gitea.store import Clock, Row, Store
from dynrunner.doubles.gitea.tokens import (
    DEFAULT_PBKDF2_ITERATIONS,
    ENDLESS_TASK_TIMEOUT_S,
    new_salted_token,
    token_matches,
)
from dynrunner.proto._gen.runner.v1 import messages_pb2 as pb

CAPABILITY_CANCELLING = "cancelling"
MODES = ("gitea", "forgejo")


@dataclass(frozen=True, slots=True)
class Options:
    mode: str = "gitea"
    zombie_timeout_s: float = 600.0
    endless_task_timeout_s: float = ENDLESS_TASK_TIMEOUT_S
    abandoned_job_timeout_s: float = 24 * 3600.0
    pbkdf2_iterations: int = DEFAULT_PBKDF2_ITERATIONS
    legacy_empty_no_more: bool = False
    default_actions_url: str = "github"
    max_concurrent_task_picks: int = 16
    profile: str = DEFAULT_PROFILE

    def __post_init__(self) -> None:
        profile(self.profile)  # raises for an unknown name
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.default_actions_url not in ("github", "self"):
            raise ValueError("default_actions_url must be 'github' or 'self'")
        if self.pbkdf2_iterations < 1:
            raise ValueError("pbkdf2_iterations must be positive")


class Engine:
    def __init__(self, state_dir: Path, options: Options) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir = state_dir
        self.options = options
        self.profile: Profile = profile(options.profile)
        """The release whose rules this instance follows (`profiles.py`); endpoints consult it."""
        self.costs = Costs()
        self.clock = Clock()
        self.store = Store(state_dir / "gitea.db")
        self.files = logs.LogFiles(state_dir / "actions_log")
        self.repos = Repositories(self.store, GitRepositories(state_dir / "git"), self.clock)
        self.instance = Instance(
            root_url="http://localhost/",
            default_actions_url=options.default_actions_url,
            signing_secret=pysecrets.token_bytes(32),
            runtime_token_ttl_s=self.profile.runtime_token_ttl_s or 3600 + int(options.endless_task_timeout_s),
            triggering_actor=self.profile.triggering_actor,
        )
        self._picks = threading.BoundedSemaphore(options.max_concurrent_task_picks)
        self._run_locks: dict[int, threading.Lock] = {}
        self._run_locks_guard = threading.Lock()

    def set_root_url(self, url: str) -> None:
        self.instance = dataclasses.replace(self.instance, root_url=url.rstrip("/") + "/")
        self.repos.root_url = self.instance.root_url

    def close(self) -> None:
        self.store.close()

    # -- runner authentication and registration -------------------------------------

    def authenticate(self, uuid: str, token: str, method: str) -> Row:
        """The `withRunner` interceptor: the PBKDF2 token check, then the heartbeat columns
        (written on every call before main's debouncing, `profiles.Profile.debounced_heartbeats`)."""
        with self.store.read() as conn:
            runner = runner_db.get_runner(conn, uuid=uuid)
        if runner is not None:
            self.costs.count("pbkdf2")
        if runner is None or not token_matches(
            token, runner["token_salt"], runner["token_hash"], self.options.pbkdf2_iterations
        ):
            raise unauthenticated()
        now = self.clock.now()
        debounced = self.profile.debounced_heartbeats
        if runner_db.heartbeat_due(runner, method, now, debounced=debounced):
            with self.store.write() as conn:
                runner_db.touch_runner(conn, runner, method, now, debounced=debounced)
            self.costs.count("runner_writes")
        return runner

    def register(self, req: pb.RegisterRequest) -> pb.Runner:
        if not req.token or not req.name:
            raise PlainError("missing runner token, name")
        with self.store.read() as conn:
            reg = runner_db.get_registration_token(conn, req.token)
        if reg is None:
            raise PlainError("runner registration token not found")
        if not reg["is_active"]:
            raise PlainError("runner registration token has been invalidated, please use the latest one")
        token = new_salted_token(self.options.pbkdf2_iterations)
        self.costs.count("pbkdf2")
        with self.store.write() as conn:
            runner_id = runner_db.create_runner(
                conn,
                name=req.name,
                owner_id=reg["owner_id"],
                repo_id=reg["repo_id"],
                version=req.version,
                labels=list(req.labels),
                ephemeral=req.ephemeral,
                cancelling=self._declares_cancelling(req.capabilities),
                token=token,
                now=self.clock.now(),
            )
            runner = runner_db.get_runner(conn, runner_id=runner_id)
        assert runner is not None
        return pb.Runner(
            id=runner["id"],
            uuid=runner["uuid"],
            token=token.token,
            name=runner["name"],
            version=runner["version"],
            labels=runner_db.runner_labels(runner),
            ephemeral=bool(runner["ephemeral"]),
        )

    def _declares_cancelling(self, capabilities: Sequence[str]) -> bool:
        """Releases before the capability ignore the field (their proto has no field 8/3)."""
        return self.profile.cancelling and CAPABILITY_CANCELLING in capabilities

    def declare(self, runner: Row, req: pb.DeclareRequest) -> pb.Runner:
        with self.store.write() as conn:
            conn.execute(
                "UPDATE runner SET labels = ?, version = ?, has_cancelling_support = ?, updated = ? WHERE id = ?",
                (
                    json.dumps(list(req.labels)),
                    req.version,
                    int(self._declares_cancelling(req.capabilities)),
                    self.clock.now(),
                    runner["id"],
                ),
            )
        return pb.Runner(
            id=runner["id"], uuid=runner["uuid"], name=runner["name"], version=req.version, labels=list(req.labels)
        )

    # -- FetchTask ---------------------------------------------------------------------

    def latest_tasks_version(self, runner: Row) -> int:
        self.costs.count("version_reads")
        with self.store.read() as conn:
            latest = runner_db.get_tasks_version(conn, runner["owner_id"], runner["repo_id"])
        if latest == 0:
            with self.store.write() as conn:
                runner_db.increase_tasks_version(conn, runner["owner_id"], runner["repo_id"])
            latest += 1
        return latest

    def pick(
        self, runner: Row, tasks_version: int, *, pause_s: float = 0.0, claim_pause_s: float = 0.0
    ) -> tuple[Row | None, int]:
        """FetchTask up to the claim: (claimed task row or None, tasks_version to answer).
        Test hooks: `pause_s` waits between reloading the runner and picking, `claim_pause_s`
        between the candidate scan and the claim."""
        latest = self.latest_tasks_version(runner)
        if tasks_version == latest:
            return None, latest
        fresh: Row | None = runner
        if self.profile.reload_runner_before_pick:
            with self.store.read() as conn:
                fresh = runner_db.get_runner(conn, uuid=runner["uuid"])
            if fresh is None:
                raise internal(f"get runner: runner with uuid {runner['uuid']}: {NOT_EXIST}")
        assert fresh is not None
        if pause_s:
            time.sleep(pause_s)
        throttled = self.profile.pick_throttle and not self._picks.acquire(blocking=False)
        if throttled:
            return None, tasks_version  # the runner retries on its next poll
        try:
            if fresh["is_disabled"]:
                return None, latest
            try:
                if not tasks.check_ephemeral(self.store, fresh, self.clock.now()):
                    return None, latest
            except tasks.RunnerRemoved as exc:
                raise internal(f"pick task: {exc}") from exc
            self.costs.count("scans")
            task = tasks.create_task_for_runner(
                self.store, fresh, self.clock.now, self.options.pbkdf2_iterations, self.profile, claim_pause_s
            )
            if task is not None:
                self.costs.count("pbkdf2")  # the task token
            return task, latest
        finally:
            if self.profile.pick_throttle:
                self._picks.release()

    def build(self, task: Row) -> pb.Task:
        with self.store.read() as conn:
            return build_task(conn, self.instance, task, self.clock.now())

    def release(self, task_id: int) -> None:
        tasks.release_task(self.store, task_id, self.clock.now(), profile=self.profile)

    # -- UpdateTask / UpdateLog ----------------------------------------------------------

    @contextmanager
    def _run_lock(self, run_id: int) -> Iterator[None]:
        with self._run_locks_guard:
            lock = self._run_locks.setdefault(run_id, threading.Lock())
        with lock:
            yield

    def update_task(self, runner: Row, req: pb.UpdateTaskRequest) -> pb.UpdateTaskResponse:
        state = req.state
        with self.store.read() as conn:
            row = conn.execute(
                "SELECT run_job.run_id FROM task JOIN run_job ON run_job.id = task.job_id WHERE task.id = ?",
                (state.id,),
            ).fetchone()
        if row is None:
            raise internal(f"update task: {NOT_EXIST}")
        run_id = int(row["run_id"])
        stopped_at = int(state.stopped_at.seconds) if state.HasField("stopped_at") else 0
        with self._run_lock(run_id), self.store.write() as conn:
            now = self.clock.now()
            try:
                task = tasks.update_task_by_state(
                    conn, runner["id"], state, now, stopped_at=stopped_at, profile=self.profile
                )
            except PlainError as exc:
                raise internal(f"update task: {exc.text}") from exc
            sent = tasks.insert_outputs(conn, task["id"], dict(req.outputs))
            if state.result != 0:
                runs.emit_jobs(conn, run_id, now, profile=self.profile)
        return pb.UpdateTaskResponse(
            state=pb.TaskState(id=state.id, result=pb.Result.ValueType(Status(task["status"]).as_result())),
            sent_outputs=sent,
        )

    def update_log(self, runner: Row, req: pb.UpdateLogRequest) -> int:
        with self.store.write() as conn:
            return logs.update_log(
                conn,
                self.files,
                runner["id"],
                req,
                self.clock.now(),
                legacy_empty_no_more=self.options.legacy_empty_no_more or not self.profile.empty_no_more_finalizes,
            )

    # -- administration ------------------------------------------------------------------

    def new_registration_token(self, owner: str | None = None, repo: str | None = None, token: str = "") -> str:
        with self.store.write() as conn:
            owner_id = repo_id = 0
            if repo is not None:
                owner_id, repo_id = runner_db.ensure_repository(conn, repo)
            elif owner is not None:
                owner_id = runner_db.ensure_owner(conn, owner)
            return runner_db.new_registration_token(conn, owner_id, repo_id, self.clock.now(), token)

    def submit(self, new: runs.NewRun) -> int:
        """`InsertRun` in one transaction: the run row first, so the workflow is parsed with
        its `github.run_id`/`run_number`; a WorkflowError rolls everything back."""
        with self.store.write() as conn:
            now = self.clock.now()
            run_id = runs.insert_run(conn, new, now)
            github = parse_context(conn, self.instance, run_id)
            parsed = parse_workflow(new.workflow, context={"github": github, "vars": new.vars})
            runs.insert_jobs(conn, run_id, parsed, now, profile=self.profile)
            return run_id

    def cancel_run(self, run_id: int) -> None:
        with self._run_lock(run_id), self.store.write() as conn:
            now = self.clock.now()
            jobs = runs.run_jobs(conn, run_id)
            if not jobs:
                raise KeyError(f"run {run_id} does not exist")
            tasks.cancel_jobs(conn, jobs, now, profile=self.profile)
            runs.emit_jobs(conn, run_id, now, profile=self.profile)

    def delete_runner(self, runner_id: int) -> None:
        """`DeleteRunner` (`models/actions/runner.go`): a soft delete, tasks untouched."""
        with self.store.write() as conn:
            if runner_db.get_runner(conn, runner_id=runner_id) is None:
                raise KeyError(f"runner {runner_id} does not exist")
            runner_db.delete_runner(conn, runner_id, self.clock.now())

    def set_runner_disabled(self, runner_id: int, disabled: bool) -> None:
        if not self.profile.runner_disabling:
            raise ValueError(f"Gitea {self.profile.name} cannot disable runners (that came with 1.26, PR #36776)")
        with self.store.write() as conn:
            runner_db.set_runner_disabled(conn, runner_id, disabled, self.clock.now())

    def reap_zombies(self) -> list[int]:
        """`StopZombieTasks`: running/cancelling tasks not updated within the zombie timeout."""
        return self._stop_tasks("updated", self.options.zombie_timeout_s)

    def reap_endless_tasks(self) -> list[int]:
        """`StopEndlessTasks`: running/cancelling tasks started longer ago than the endless
        timeout (3 h), however often they report."""
        return self._stop_tasks("started", self.options.endless_task_timeout_s)

    def _stop_tasks(self, column: str, timeout_s: float) -> list[int]:
        """`stopTasks`: the tasks fail (cancelling ones are cancelled) with their unfinished
        steps, their logs are archived when a log file exists, dependents are emitted."""
        now = self.clock.now()
        with self.store.read() as conn:
            found = tasks.tasks_before(conn, column, now - int(timeout_s))
        stopped = []
        for task in found:
            status = Status.CANCELLED if task["status"] == Status.CANCELLING else Status.FAILURE
            with self.store.write() as conn:
                run_id = conn.execute("SELECT run_id FROM run_job WHERE id = ?", (task["job_id"],)).fetchone()["run_id"]
                tasks.stop_task(conn, task["id"], status, now, profile=self.profile)
                logs.archive_after_stop(conn, self.files, task["id"], now)
                runs.emit_jobs(conn, run_id, now, profile=self.profile)
            stopped.append(int(task["id"]))
        return stopped

    def cancel_abandoned_jobs(self) -> list[int]:
        """`CancelAbandonedJobs`: waiting or blocked jobs not updated within the abandoned
        timeout (24 h) are cancelled (`CancelJobs`); returns their ids."""
        now = self.clock.now()
        with self.store.read() as conn:
            if not runs.abandoned_jobs(conn, now - int(self.options.abandoned_job_timeout_s)):
                return []
        with self.store.write() as conn:
            jobs = runs.abandoned_jobs(conn, now - int(self.options.abandoned_job_timeout_s))
            tasks.cancel_jobs(conn, jobs, now, profile=self.profile)
            for run_id in sorted({int(j["run_id"]) for j in jobs}):
                runs.emit_jobs(conn, run_id, now, profile=self.profile)
        return [int(j["id"]) for j in jobs]

    def run_crons(self) -> None:
        """The Actions crons Gitea schedules (zombie tasks every 5 min, endless tasks every
        30 min, abandoned jobs every 6 h), all at once."""
        self.reap_zombies()
        self.reap_endless_tasks()
        self.cancel_abandoned_jobs()
