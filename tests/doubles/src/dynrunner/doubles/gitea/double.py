"""`GiteaDouble`: the double's Python API, and its in-process HTTP server.

    async with GiteaDouble.start(tmp_path) as gitea:
        run = gitea.submit("owner/repo", WORKFLOW)
        client = GiteaClient(gitea.url)
        runner = await client.register(name="r", registration_token=gitea.registration_token, labels=[...])

The synchronous methods touch only SQLite and are safe to call from the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import secrets as pysecrets
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from dynrunner.doubles.gitea import admin, runs, views
from dynrunner.doubles.gitea.app import build_app
from dynrunner.doubles.gitea.artifacts_service import ArtifactService, ArtifactView
from dynrunner.doubles.gitea.artifacts_v3 import ArtifactsV3
from dynrunner.doubles.gitea.artifacts_v4 import ArtifactsV4
from dynrunner.doubles.gitea.costs import CostView
from dynrunner.doubles.gitea.engine import Engine, Options
from dynrunner.doubles.gitea.events import default_event
from dynrunner.doubles.gitea.githttp import GitHTTP
from dynrunner.doubles.gitea.profiles import DEFAULT_PROFILE, Profile
from dynrunner.doubles.gitea.repos import RepoView
from dynrunner.doubles.gitea.service import PingServiceImpl, RunnerServiceImpl, Worker
from dynrunner.doubles.gitea.tokens import DEFAULT_PBKDF2_ITERATIONS, decode_runtime_token
from dynrunner.doubles.serving import serve_asgi

_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$", re.IGNORECASE)
_FORBIDDEN_PREFIX = re.compile(r"^GIT(EA|HUB)_", re.IGNORECASE)


def _actions_name(name: str) -> str:
    """`secret_service.ValidateName`, then the upper-casing of `InsertEncryptedSecret`/`InsertVariable`."""
    if not _NAME.match(name) or _FORBIDDEN_PREFIX.match(name) or name.upper() == "CI":
        raise ValueError(f"invalid variable or secret name: {name!r}")
    return name.upper()


def _normalize_eol(value: str) -> str:
    """`util.NormalizeStringEOL`, applied to variable values."""
    return value.replace("\r\n", "\n").replace("\r", "\n")


class GiteaDouble:
    """A Gitea instance's Actions runner API, backed by SQLite in `state_dir`."""

    def __init__(
        self,
        state_dir: Path,
        *,
        mode: str = "gitea",
        zombie_timeout_s: float = 600.0,
        endless_task_timeout_s: float = 3 * 3600.0,
        abandoned_job_timeout_s: float = 24 * 3600.0,
        pbkdf2_iterations: int = DEFAULT_PBKDF2_ITERATIONS,
        legacy_empty_no_more: bool = False,
        default_actions_url: str = "github",
        max_concurrent_task_picks: int = 16,
        reap_interval_s: float | None = None,
        workers: int = 16,
        profile: str = DEFAULT_PROFILE,
    ) -> None:
        """`profile` chooses the Gitea release whose rules the double follows ("1.24", "1.25",
        "1.26" or "main"; `profiles.py`); `legacy_empty_no_more=True` forces the pre-1.27
        UpdateLog rule on `main` too."""
        self.options = Options(
            mode=mode,
            zombie_timeout_s=zombie_timeout_s,
            endless_task_timeout_s=endless_task_timeout_s,
            abandoned_job_timeout_s=abandoned_job_timeout_s,
            pbkdf2_iterations=pbkdf2_iterations,
            legacy_empty_no_more=legacy_empty_no_more,
            default_actions_url=default_actions_url,
            max_concurrent_task_picks=max_concurrent_task_picks,
            profile=profile,
        )
        self.state_dir = Path(state_dir)
        self.engine = Engine(self.state_dir, self.options)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gitea-double")
        self._worker = Worker(self.engine, self._pool)
        self.runner_service = RunnerServiceImpl(self._worker)
        self.hooks = self.runner_service.hooks
        git = GitHTTP(self.engine, self._pool)
        self.artifact_service = ArtifactService(self.engine, self._pool)
        self.artifacts_v4 = ArtifactsV4(self.artifact_service)
        self.app = build_app(
            self.runner_service,
            PingServiceImpl(),
            admin.build(self, self._pool),
            git,
            ArtifactsV3(self.artifact_service),
            self.artifacts_v4,
        )
        self.reap_interval_s = reap_interval_s if reap_interval_s is not None else min(300.0, zombie_timeout_s / 4)
        self.url = ""
        self.registration_token = self.engine.new_registration_token()
        self.commit = self.engine.repos.commit  # documented there

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls, state_dir: Path, *, host: str = "127.0.0.1", port: int = 0, **options: Any
    ) -> AsyncIterator[GiteaDouble]:
        """Serve on `host:port` (0 = a free port) until the block ends."""
        double = cls(state_dir, **options)
        try:
            async with double.serving(host, port):
                yield double
        finally:
            double.close()

    @contextlib.asynccontextmanager
    async def serving(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[None]:
        """Serve the app in this event loop; `url` is set once the socket is bound."""
        async with serve_asgi(self.app, host, port, name="Gitea double") as url:
            self.url = url
            self.engine.set_root_url(self.url)
            reaper = asyncio.create_task(self._reap_forever(), name="gitea-double-reaper")
            try:
                yield
            finally:
                reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reaper

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval_s)
            await asyncio.wrap_future(self._pool.submit(self.engine.run_crons))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.engine.close()

    @property
    def profile(self) -> Profile:
        """The Gitea release this double answers as."""
        return self.engine.profile

    def costs(self) -> CostView:
        """What the runner calls answered so far cost (`costs.py`): token hashes, runner row
        writes, job scans, and the CPU seconds spent per method."""
        return self.engine.costs.view()

    def reset_costs(self) -> None:
        self.engine.costs.reset()

    # -- registration tokens and runners ---------------------------------------------------

    def new_registration_token(self, owner: str | None = None, repo: str | None = None) -> str:
        """A new token for the scope (global, an owner, or "owner/repo"); older ones of the
        same scope stop working. A new global token also replaces `registration_token`."""
        token = self.engine.new_registration_token(owner, repo)
        if owner is None and repo is None:
            self.registration_token = token
        return token

    def runners(self, *, include_deleted: bool = False) -> list[views.RunnerView]:
        with self.engine.store.read() as conn:
            return views.runner_views(conn, self.engine.clock.now(), include_deleted=include_deleted)

    def delete_runner(self, runner_id: int) -> None:
        """What an admin's `DELETE /api/v1/admin/actions/runners/{id}` does (1.24 on): the
        runner row goes (its calls fail "unregistered runner"); its task, if any, runs on until
        the zombie reaper ends it. KeyError for an unknown runner."""
        self.engine.delete_runner(runner_id)

    def set_runner_disabled(self, runner_id: int, disabled: bool = True) -> None:
        """Disable (or enable) a runner, as `PATCH .../runners/{id}`; ValueError before 1.26."""
        self.engine.set_runner_disabled(runner_id, disabled)

    def tasks_version(self, owner: str | None = None, repo: str | None = None) -> int:
        with self.engine.store.read() as conn:
            owner_id = repo_id = 0
            if repo is not None:
                row = conn.execute(
                    "SELECT repository.id FROM repository JOIN owner ON owner.id = repository.owner_id "
                    "WHERE owner.name || '/' || repository.name = ?",
                    (repo,),
                ).fetchone()
                repo_id = row["id"] if row else -1
            elif owner is not None:
                row = conn.execute("SELECT id FROM owner WHERE name = ?", (owner,)).fetchone()
                owner_id = row["id"] if row else -1
            return views.tasks_version(conn, owner_id, repo_id)

    # -- repositories ----------------------------------------------------------------------

    def create_repository(self, full_name: str, *, private: bool = False, default_branch: str = "main") -> RepoView:
        """A new, empty repository (public unless `private`), served at `<url>/<owner>/<name>.git`.
        A name already in use raises ValueError (repositories named by a submitted run or a
        registration token exist already: create the repository first)."""
        return self.engine.repos.create(full_name, private=private, default_branch=default_branch)

    def repository(self, full_name: str) -> RepoView:
        return self.engine.repos.view(full_name)

    # -- artifacts ---------------------------------------------------------------------------

    def artifacts(self, run_id: int) -> list[ArtifactView]:
        """Every artifact row of a run (one per file for v3, one per artifact for v4)."""
        return self.artifact_service.views(run_id)

    def artifact_content(self, artifact_id: int) -> bytes:
        """The stored bytes of a confirmed artifact (a v3 file, gzipped if uploaded so; a v4 zip)."""
        for view in self.artifact_service.views(self._artifact_run(artifact_id)):
            if view.id == artifact_id and view.storage_path:
                return self.artifact_service.files.read(view.storage_path)
        raise KeyError(f"artifact {artifact_id} has no stored content")

    def _artifact_run(self, artifact_id: int) -> int:
        with self.engine.store.read() as conn:
            row = conn.execute("SELECT run_id FROM artifact WHERE id = ?", (artifact_id,)).fetchone()
        if row is None:
            raise KeyError(f"artifact {artifact_id} does not exist")
        return int(row["run_id"])

    # -- runs ------------------------------------------------------------------------------

    def submit(
        self,
        repository: str = "owner/repo",
        workflow: str | Mapping[str, Any] | None = None,
        *,
        event_name: str = "push",
        event: Mapping[str, Any] | None = None,
        ref: str = "refs/heads/main",
        sha: str | None = None,
        secrets: Mapping[str, str] | None = None,
        vars: Mapping[str, str] | None = None,
        workflow_file: str = "ci.yml",
        actor: str = "gitea-admin",
        is_fork_pull_request: bool = False,
    ) -> views.RunView:
        """Create a run of `workflow` as a push (or `event_name`) would; matrix jobs expand.

        Secret and variable names follow Gitea's rules (`[A-Za-z_][A-Za-z0-9_]*`, no
        `GITHUB_`/`GITEA_` prefix, not `CI`; ValueError otherwise) and are stored upper-cased;
        variable values get their line ends normalized to `\\n`, as Gitea stores them.
        `sha` defaults to the commit `ref` names in the repository (see `commit`), else a
        random one."""
        if workflow is None:
            raise TypeError("submit() needs a workflow")
        sha = sha or self.engine.repos.head(repository, ref) or pysecrets.token_hex(20)
        payload = (
            dict(event)
            if event is not None
            else default_event(
                self.url,
                repository,
                event_name,
                ref,
                sha,
                actor,
                self.engine.repos.settings(repository),
                self.profile.event_repository_keys,
            )
        )
        run_id = self.engine.submit(
            runs.NewRun(
                repository=repository,
                workflow=workflow,
                workflow_file=workflow_file,
                event_name=event_name,
                event_payload=payload,
                ref=ref,
                sha=sha,
                actor=actor,
                secrets={_actions_name(k): v for k, v in (secrets or {}).items()},
                vars={_actions_name(k): _normalize_eol(v) for k, v in (vars or {}).items()},
                is_fork_pull_request=is_fork_pull_request,
            )
        )
        return self.run(run_id)

    def run(self, run_id: int) -> views.RunView:
        with self.engine.store.read() as conn:
            return views.run_view(conn, run_id)

    def runs(self) -> list[views.RunView]:
        with self.engine.store.read() as conn:
            return [views.run_view(conn, run_id) for run_id in views.run_ids(conn)]

    def jobs(self, run_id: int) -> list[views.JobView]:
        return self.run(run_id).jobs

    def job_counts(self) -> dict[str, int]:
        """How many jobs are in each status (Gitea's words), over every run."""
        with self.engine.store.read() as conn:
            return views.job_counts(conn)

    def task(self, task_id: int) -> views.TaskView:
        with self.engine.store.read() as conn:
            return views.task_view(conn, self.engine.files, task_id)

    def cancel_run(self, run_id: int) -> None:
        self.engine.cancel_run(run_id)

    def reap_zombies(self) -> list[int]:
        """Run the zombie reaper now; returns the ids of the tasks it stopped."""
        return self.engine.reap_zombies()

    def reap_endless_tasks(self) -> list[int]:
        """Run the endless-task reaper now (tasks started over 3 h ago); returns the task ids."""
        return self.engine.reap_endless_tasks()

    def cancel_abandoned_jobs(self) -> list[int]:
        """Cancel waiting/blocked jobs not updated for 24 h now; returns the job ids."""
        return self.engine.cancel_abandoned_jobs()

    def advance_clock(self, seconds: float) -> None:
        """Move the double's clock forward (zombie timeouts, heartbeat debounce, ordering)."""
        self.engine.clock.advance(seconds)

    def decode_runtime_token(self, token: str) -> dict[str, Any]:
        """Verify a `gitea_runtime_token` with this instance's secret and return its claims."""
        return decode_runtime_token(token, self.engine.instance.signing_secret)

    async def wait_run(self, run_id: int, timeout_s: float = 30.0) -> views.RunView:
        """Wait until the run is done (success, failure, cancelled or skipped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            run = self.run(run_id)
            if run.done:
                return run
            if loop.time() >= deadline:
                raise TimeoutError(f"run {run_id} still {run.status} after {timeout_s}s")
            await asyncio.sleep(0.05)
