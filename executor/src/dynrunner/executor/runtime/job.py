"""`JobRuntime`: the one object the job engine (and the `artifact` CLI inside a step) uses for the
job's workspace, step files, bounded outputs and artifacts.

The artifact machinery (collecting, archives, stores, staging) is imported when a job first
publishes or imports an artifact: most jobs do neither, and the executor starts faster without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dynrunner.executor.runtime.ahead import StepFilesPool
from dynrunner.executor.runtime.artifacts.errors import ArtifactError, StagingError
from dynrunner.executor.runtime.artifacts.refs import (
    ARTIFACTS_OUTPUT_KEY,
    ArtifactRef,
    decode_refs,
    encode_refs,
    parse_from,
)
from dynrunner.executor.runtime.blocking import in_thread
from dynrunner.executor.runtime.outputs import OutputBudget, OutputLimits, read_output_file
from dynrunner.executor.runtime.repository import Repository, check_run_id
from dynrunner.executor.runtime.workspace import StepFiles, Workspace
from dynrunner.proto.assignment import ArtifactStoreOptions
from dynrunner.proto.gitea.types import Need, Result

if TYPE_CHECKING:
    from dynrunner.executor.runtime.artifacts.collect import Entry
    from dynrunner.executor.runtime.artifacts.store import ArtifactStore

STATE_FILE = "job.json"
STATE_VERSION = 1

Log = Callable[[str], None]


class JobRuntime:
    def __init__(
        self,
        workspace: Workspace,
        *,
        repository: Repository,
        run_id: str,
        job_key: str,
        artifacts: ArtifactStoreOptions,
        needs: Mapping[str, Need],
        limits: OutputLimits,
    ) -> None:
        self.workspace = workspace
        self.repository = repository
        self.run_id = check_run_id(run_id)
        self.job_key = job_key
        self.artifacts = artifacts
        self.needs = dict(needs)
        self.limits = limits
        self._budget = OutputBudget(limits)
        self._published: dict[str, ArtifactRef] = {}
        self._store: ArtifactStore | None = None
        self._store_lock = threading.Lock()

    @classmethod
    def create(
        cls,
        workspace_root: Path,
        *,
        repository: str,
        run_id: str,
        job_key: str,
        artifacts: ArtifactStoreOptions,
        needs: Mapping[str, Need],
        limits: OutputLimits = OutputLimits(),  # noqa: B008 - immutable
    ) -> JobRuntime:
        """Lay out the workspace and record what `dynrunner-executor artifact` needs in `.dynrunner/job.json`."""
        repo = Repository.parse(repository)
        runtime = cls(
            Workspace.create(workspace_root, repo),
            repository=repo,
            run_id=run_id,
            job_key=job_key,
            artifacts=artifacts,
            needs=needs,
            limits=limits,
        )
        runtime._write_state()
        return runtime

    @classmethod
    def load(cls, runtime_dir: Path) -> JobRuntime:
        """The runtime of the job whose `.dynrunner/` directory this is (for the CLI inside a step)."""
        try:
            state = json.loads((runtime_dir / STATE_FILE).read_text())
        except (OSError, ValueError) as err:
            raise ArtifactError(f"cannot read the job's runtime state in {runtime_dir}: {err}") from None
        if state.get("version") != STATE_VERSION:
            raise ArtifactError(f"the job's runtime state in {runtime_dir} has an unknown version")
        repo = Repository.parse(state["repository"])
        needs = {
            job: Need(
                outputs={ARTIFACTS_OUTPUT_KEY: n["artifacts"]} if n["artifacts"] else {},
                result=Result.from_word(n["result"]),
            )
            for job, n in state["needs"].items()
        }
        return cls(
            Workspace.at(Path(state["workspace_root"]), repo),
            repository=repo,
            run_id=state["run_id"],
            job_key=state["job_key"],
            artifacts=ArtifactStoreOptions(**state["artifacts"]),
            needs=needs,
            limits=OutputLimits(**state["limits"]),
        )

    def _write_state(self) -> None:
        state = {
            "version": STATE_VERSION,
            "workspace_root": str(self.workspace.root),
            "repository": str(self.repository),
            "run_id": self.run_id,
            "job_key": self.job_key,
            "artifacts": dataclasses.asdict(self.artifacts),
            "needs": {
                job: {"result": need.result.word, "artifacts": need.outputs.get(ARTIFACTS_OUTPUT_KEY, "")}
                for job, need in self.needs.items()
            },
            "limits": dataclasses.asdict(self.limits),
        }
        path = self.workspace.runtime_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "w") as fp:
            json.dump(state, fp)
        os.replace(tmp, path)

    # -- steps and outputs -------------------------------------------------------------------

    def step_files(self, step_index: int, attempt: str = "") -> StepFiles:
        return self.workspace.step_files(step_index, attempt)

    def step_files_pool(self) -> StepFilesPool:
        """Fresh files for each step as it starts, made ahead in the background."""
        return StepFilesPool(self.workspace)

    def read_outputs(self, files: StepFiles) -> dict[str, str]:
        """The step's GITHUB_OUTPUT within the limits; raises OutputLimitError or EnvFileError."""
        outputs = read_output_file(files.output, self.limits)
        self._budget.record(files.key, outputs)
        return outputs

    # -- artifacts ---------------------------------------------------------------------------

    def store(self) -> ArtifactStore:
        from dynrunner.executor.runtime.artifacts.store import Scope, open_store

        with self._store_lock:
            if self._store is None:
                self._store = open_store(self.artifacts, Scope(self.repository, self.run_id))
            return self._store

    async def after_step_success(self, files: StepFiles, log: Log) -> None:
        """Upload what the step left at the top of its KRUNTIME_ARTIFACTS_DIR. All or nothing: the
        step's artifacts join the job's namespace (replacing same-named ones) only if every one uploads."""
        from dynrunner.executor.runtime.artifacts.collect import collect

        entries = await in_thread(lambda stop: collect(files.artifacts_dir))
        if not entries:
            return
        if not self.artifacts.driver:
            names = ", ".join(e.name for e in entries)
            raise ArtifactError(
                f"the step left {names} in $KRUNTIME_ARTIFACTS_DIR, but no artifact store is configured for this "
                "runner, so it cannot be uploaded"
            )
        store = await in_thread(lambda stop: self.store())
        uploaded: dict[str, ArtifactRef] = {}
        for entry in entries:
            started = time.monotonic()
            ref = await in_thread(lambda stop, e=entry: self._upload(store, e, stop))  # type: ignore[misc]
            uploaded[entry.name] = ref
            log(
                f"Uploaded artifact '{ref.name}' ({ref.type.value}, {_size(ref.size)}, {ref.digest[:19]}…) "
                f"in {time.monotonic() - started:.1f}s"
            )
        refs = {**self._published, **uploaded}
        encoded = encode_refs(refs.values())
        if len(encoded.encode()) > self.limits.value_bytes:
            raise ArtifactError(
                f"this job's {len(refs)} artifact refs take {len(encoded.encode())} bytes; they travel in the output "
                f"'{ARTIFACTS_OUTPUT_KEY}', whose limit is {self.limits.value_bytes} bytes (publish fewer, larger "
                "artifacts, e.g. one directory)"
            )
        self._published = refs

    @staticmethod
    def _upload(store: ArtifactStore, entry: Entry, stop: threading.Event) -> ArtifactRef:
        try:
            blob = store.put(entry.produce, stop)
        except ArtifactError as err:
            raise ArtifactError(f"artifact '{entry.name}' was not uploaded: {err}") from None
        return ArtifactRef(entry.name, store.driver, entry.type, blob.location, blob.digest, blob.size)

    def list_artifacts(self) -> list[ArtifactRef]:
        """What this job's direct needs published, by job and name. A ref outside this repository is
        refused (ScopeError), so a job never even lists another repository's artifacts."""
        from dynrunner.executor.runtime.artifacts.store import Scope

        scope = Scope(self.repository, self.run_id)
        refs: list[ArtifactRef] = []
        for job in sorted(self.needs):
            found = sorted(self._refs_of(job).values(), key=lambda r: r.name)
            for ref in found:
                scope.check(ref)
            refs.extend(found)
        return refs

    def job_outputs(self) -> dict[str, str]:
        """The reserved output carrying this job's artifact refs to dependent jobs ({} if none)."""
        return {ARTIFACTS_OUTPUT_KEY: encode_refs(self._published.values())} if self._published else {}

    @property
    def published(self) -> Mapping[str, ArtifactRef]:
        return dict(self._published)

    def _refs_of(self, job: str) -> dict[str, ArtifactRef]:
        raw = self.needs[job].outputs.get(ARTIFACTS_OUTPUT_KEY, "")
        return decode_refs(raw, job=job) if raw else {}

    async def import_artifact(self, from_: str, path: str, log: Log, *, cwd: Path | None = None) -> None:
        """Stage `jobs.<job>.artifacts.<name>` at `path`, relative to the workspace (or to `cwd`, which
        must lie inside it, for the CLI)."""
        job, name = parse_from(from_)
        ref = self._find(job, name)
        destination = self._destination(path, cwd)
        store = await in_thread(lambda stop: self.store())
        location = store.scope.check(ref, store.driver)
        started = time.monotonic()
        await in_thread(lambda stop: self._stage(store, location, ref, destination, stop))
        log(
            f"Imported artifact '{name}' of job '{job}' ({ref.type.value}, {_size(ref.size)}) to "
            f"{'/'.join(destination)} in {time.monotonic() - started:.1f}s"
        )

    def _find(self, job: str, name: str) -> ArtifactRef:
        need = self.needs.get(job)
        if need is None:
            needs = ", ".join(sorted(self.needs)) or "no jobs"
            raise ArtifactError(
                f"job '{job}' is not a direct need of this job (it needs {needs}); artifacts can only be imported "
                f"from jobs listed in `needs:`"
            )
        refs = self._refs_of(job)
        ref = refs.get(name)
        if ref is not None:
            return ref
        published = ", ".join(sorted(refs)) if refs else "no artifacts"
        if need.result is not Result.SUCCESS:
            raise ArtifactError(
                f"artifact '{name}' of job '{job}' is not available: job '{job}' finished with result "
                f"'{need.result.word or 'unknown'}' and published {published}"
            )
        raise ArtifactError(f"job '{job}' did not publish an artifact named '{name}'; it published {published}")

    def _destination(self, path: str, cwd: Path | None) -> list[str]:
        from dynrunner.executor.runtime.artifacts.paths import relative_parts

        parts = relative_parts(path, what="import path")
        if cwd is None:
            return parts
        inside = os.path.relpath(os.path.realpath(cwd), self.workspace.path)
        if inside == ".":
            return parts
        if inside.startswith(".."):
            raise StagingError(f"the current directory {cwd} is outside the workspace {self.workspace.path}")
        return [*inside.split("/"), *parts]

    def _stage(
        self, store: ArtifactStore, location: str, ref: ArtifactRef, destination: list[str], stop: threading.Event
    ) -> None:
        from dynrunner.executor.runtime.artifacts.paths import DIR_FLAGS, opened_dir
        from dynrunner.executor.runtime.artifacts.staging import stage

        shown = "/".join(destination)
        inside_root = self.workspace.path.relative_to(self.workspace.root).parts
        root_fd = os.open(self.workspace.root, DIR_FLAGS & ~os.O_NOFOLLOW)
        with contextlib.ExitStack() as stack:
            stack.callback(os.close, root_fd)
            base = stack.enter_context(opened_dir(root_fd, inside_root, create=False, shown="the workspace"))
            source = stack.enter_context(store.open(location))
            stage(source, ref, base, destination, max_size=store.max_size, stop=stop, shown=shown)


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
