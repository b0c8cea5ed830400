"""Job-to-job artifacts through JobRuntime, on both drivers: a `build` job publishes through its
reserved output, a `deploy` job that needs it imports and lists; the failure cases name what matters."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynrunner.executor.runtime import ARTIFACTS_OUTPUT_KEY, ArtifactError, JobRuntime, ScopeError
from dynrunner.executor.runtime.artifacts.refs import ArtifactType, decode_refs
from dynrunner.executor.runtime.artifacts.store import ArtifactStore, Producer, Readable, StoredBlob
from dynrunner.proto.assignment import ArtifactStoreOptions
from dynrunner.proto.gitea.types import Need, Result
from tests.fixtures.artifact_backends import Backend


def job(
    tmp_path: Path, backend: Backend, name: str, needs: dict[str, Need] | None = None, repo: str = "acme/app"
) -> JobRuntime:
    return JobRuntime.create(
        tmp_path / name, repository=repo, run_id="77", job_key=name, artifacts=backend.options, needs=needs or {}
    )


def need(producer: JobRuntime, result: Result = Result.SUCCESS) -> Need:
    return Need(outputs={"tests": "passed", **producer.job_outputs()}, result=result)


async def publish(runtime: JobRuntime, step: int, entries: dict[str, bytes | dict[str, bytes]]) -> list[str]:
    files = runtime.step_files(step)
    for name, content in entries.items():
        if isinstance(content, dict):
            (files.artifacts_dir / name).mkdir()
            for inner, data in content.items():
                (files.artifacts_dir / name / inner).write_bytes(data)
        else:
            (files.artifacts_dir / name).write_bytes(content)
    lines: list[str] = []
    await runtime.after_step_success(files, lines.append)
    return lines


async def test_build_publishes_and_deploy_imports_and_lists(tmp_path: Path, backend: Backend) -> None:
    build = job(tmp_path, backend, "build")
    dist = os.urandom(300_000)
    lines = await publish(build, 2, {"dist.tgz": dist, "site": {"index.html": b"<h1>hi</h1>", "app.js": b"1"}})
    assert [line.split(" (")[0] for line in lines] == ["Uploaded artifact 'dist.tgz'", "Uploaded artifact 'site'"]
    outputs = build.job_outputs()
    assert list(outputs) == [ARTIFACTS_OUTPUT_KEY]
    refs = decode_refs(outputs[ARTIFACTS_OUTPUT_KEY], job="build")
    assert refs["dist.tgz"].type is ArtifactType.FILE and refs["dist.tgz"].size == len(dist)
    assert refs["site"].type is ArtifactType.DIRECTORY and refs["dist.tgz"].driver == backend.driver

    deploy = job(tmp_path, backend, "deploy", {"build": need(build)})
    listed = deploy.list_artifacts()
    assert [(r.job, r.name, r.type) for r in listed] == [
        ("build", "dist.tgz", ArtifactType.FILE),
        ("build", "site", ArtifactType.DIRECTORY),
    ]
    log: list[str] = []
    await deploy.import_artifact("jobs.build.artifacts.dist.tgz", "dist.tgz", log.append)
    await deploy.import_artifact("jobs.build.artifacts.site", "public/site", log.append)
    assert (deploy.workspace.path / "dist.tgz").read_bytes() == dist
    assert (deploy.workspace.path / "public" / "site" / "index.html").read_bytes() == b"<h1>hi</h1>"
    assert log[0].startswith("Imported artifact 'dist.tgz' of job 'build' (File, 293.0 KiB) to dist.tgz in ")


async def test_names_form_one_namespace_per_job_and_the_last_successful_write_wins(
    tmp_path: Path, backend: Backend
) -> None:
    build = job(tmp_path, backend, "build")
    await publish(build, 0, {"report": b"first", "kept": b"from step 0"})
    await publish(build, 1, {"report": b"second"})
    files = build.step_files(2)
    (files.artifacts_dir / "report").write_bytes(b"third, but the step's upload fails")
    (files.artifacts_dir / "zz-link").symlink_to("/etc/hostname")
    with pytest.raises(ArtifactError, match=r"\$KRUNTIME_ARTIFACTS_DIR/zz-link is a symbolic link"):
        await build.after_step_success(files, lambda line: None)
    deploy = job(tmp_path, backend, "deploy", {"build": need(build)})
    await deploy.import_artifact("jobs.build.artifacts.report", "report", lambda line: None)
    await deploy.import_artifact("jobs.build.artifacts.kept", "kept", lambda line: None)
    assert (deploy.workspace.path / "report").read_bytes() == b"second"
    assert (deploy.workspace.path / "kept").read_bytes() == b"from step 0"


async def test_a_missing_artifact_fails_naming_the_job_the_artifact_and_what_exists(
    tmp_path: Path, backend: Backend
) -> None:
    build = job(tmp_path, backend, "build")
    await publish(build, 0, {"dist.tgz": b"x", "sbom.json": b"{}"})
    quiet = job(tmp_path, backend, "quiet")
    deploy = job(tmp_path, backend, "deploy", {"build": need(build), "quiet": need(quiet)})
    with pytest.raises(ArtifactError) as info:
        await deploy.import_artifact("jobs.build.artifacts.dist.zip", "dist.zip", lambda line: None)
    assert (
        str(info.value) == "job 'build' did not publish an artifact named 'dist.zip'; it published dist.tgz, sbom.json"
    )
    with pytest.raises(
        ArtifactError, match="job 'quiet' did not publish an artifact named 'x'; it published no artifacts"
    ):
        await deploy.import_artifact("jobs.quiet.artifacts.x", "x", lambda line: None)
    assert not (deploy.workspace.path / "dist.zip").exists()


async def test_only_direct_needs_can_be_imported_from(tmp_path: Path, backend: Backend) -> None:
    deploy = job(tmp_path, backend, "deploy", {"test": Need(outputs={}, result=Result.SUCCESS)})
    with pytest.raises(ArtifactError) as info:
        await deploy.import_artifact("jobs.build.artifacts.dist.tgz", "dist.tgz", lambda line: None)
    assert str(info.value) == (
        "job 'build' is not a direct need of this job (it needs test); artifacts can only be imported from jobs "
        "listed in `needs:`"
    )


async def test_a_failed_need_says_so(tmp_path: Path, backend: Backend) -> None:
    deploy = job(tmp_path, backend, "deploy", {"build": Need(outputs={}, result=Result.FAILURE)})
    with pytest.raises(
        ArtifactError,
        match=r"artifact 'dist\.tgz' of job 'build' is not available: job 'build' finished with result 'failure' "
        r"and published no artifacts",
    ):
        await deploy.import_artifact("jobs.build.artifacts.dist.tgz", "dist.tgz", lambda line: None)


async def test_without_a_store_an_artifact_left_by_a_step_fails_it(tmp_path: Path) -> None:
    runtime = JobRuntime.create(
        tmp_path, repository="a/b", run_id="1", job_key="j", artifacts=ArtifactStoreOptions(), needs={}
    )
    files = runtime.step_files(0)
    await runtime.after_step_success(files, lambda line: None)
    assert runtime.job_outputs() == {}
    (files.artifacts_dir / "dist.tgz").write_bytes(b"x")
    with pytest.raises(ArtifactError, match=r"left dist\.tgz in \$KRUNTIME_ARTIFACTS_DIR, but no artifact store"):
        await runtime.after_step_success(files, lambda line: None)


async def test_too_many_refs_for_one_output_value_fail_the_step(tmp_path: Path, backend: Backend) -> None:
    runtime = JobRuntime.create(
        tmp_path,
        repository="a/b",
        run_id="1",
        job_key="j",
        artifacts=backend.options,
        needs={},
    )
    runtime.limits = type(runtime.limits)(value_bytes=600)
    with pytest.raises(ArtifactError, match=r"this job's 3 artifact refs take \d+ bytes; .* whose limit is 600 bytes"):
        await publish(runtime, 0, {"a": b"1", "b": b"2", "c": b"3"})
    assert runtime.job_outputs() == {}


# -- scope: one repository's job cannot import, list or overwrite another's artifacts ----------------


async def test_a_job_cannot_import_or_list_another_repositorys_artifacts(tmp_path: Path, backend: Backend) -> None:
    victim = job(tmp_path, backend, "build", repo="victim/private")
    await publish(victim, 0, {"secret.txt": b"victim data"})
    stolen = victim.job_outputs()  # e.g. copied into the attacker's own job outputs
    attacker = job(tmp_path, backend, "deploy", {"build": Need(outputs=stolen, result=Result.SUCCESS)}, repo="evil/app")
    with pytest.raises(ScopeError, match="belongs to repository 'victim/private', not to 'evil/app'"):
        await attacker.import_artifact("jobs.build.artifacts.secret.txt", "loot", lambda line: None)
    with pytest.raises(ScopeError, match="belongs to repository 'victim/private'"):
        attacker.list_artifacts()
    assert not (attacker.workspace.path / "loot").exists()
    location = decode_refs(stolen[ARTIFACTS_OUTPUT_KEY], job="b")["secret.txt"].location
    with pytest.raises(ScopeError, match="not in this repository's part of the store"), attacker.store().open(location):
        pass


async def test_a_job_cannot_overwrite_another_repositorys_artifacts(tmp_path: Path, backend: Backend) -> None:
    victim = job(tmp_path, backend, "build", repo="victim/app")
    await publish(victim, 0, {"dist.tgz": b"genuine"})
    attacker = job(tmp_path, backend, "build2", repo="evil/app")
    await publish(attacker, 0, {"dist.tgz": b"genuine"})  # the same content and name
    await publish(attacker, 1, {"dist.tgz": b"trojan"})
    victim_ref = decode_refs(victim.job_outputs()[ARTIFACTS_OUTPUT_KEY], job="build")["dist.tgz"]
    attacker_refs = decode_refs(attacker.job_outputs()[ARTIFACTS_OUTPUT_KEY], job="build2")
    assert victim_ref.location.startswith("victim/app/") and attacker_refs["dist.tgz"].location.startswith("evil/app/")
    consumer = job(tmp_path, backend, "deploy", {"build": need(victim)}, repo="victim/app")
    await consumer.import_artifact("jobs.build.artifacts.dist.tgz", "dist.tgz", lambda line: None)
    assert (consumer.workspace.path / "dist.tgz").read_bytes() == b"genuine"
    assert not any(path.startswith(backend.blob_path("victim/app/")) and "trojan" in path for path in backend.stored())


async def test_a_planted_link_in_the_filesystem_store_does_not_lead_into_another_repository(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "victim" / "app").mkdir(parents=True)
    (root / "evil").mkdir()
    (root / "evil" / "app").symlink_to(root / "victim" / "app", target_is_directory=True)
    options = ArtifactStoreOptions(driver="Filesystem", path=str(root))
    attacker = JobRuntime.create(
        tmp_path / "j", repository="evil/app", run_id="1", job_key="b", artifacts=options, needs={}
    )
    with pytest.raises(ArtifactError, match="is a symbolic link; refusing to follow it"):
        await publish(attacker, 0, {"dist.tgz": b"trojan"})
    assert list((root / "victim" / "app").iterdir()) == []


# -- cancellation -------------------------------------------------------------------------------------


class GatedStore:
    """A real store whose reads wait at a gate after the first chunk, so a test can cancel mid-transfer."""

    def __init__(self, inner: ArtifactStore) -> None:
        self.inner = inner
        self.driver = inner.driver
        self.scope = inner.scope
        self.max_size = inner.max_size
        self.reading = threading.Event()
        self.reads = 0

    def put(self, producer: Producer, stop: threading.Event) -> StoredBlob:
        return self.inner.put(producer, stop)

    def open(self, location: str):  # type: ignore[no-untyped-def]
        store = self

        class Gate:
            def __init__(self, source: Readable) -> None:
                self.source = source

            def read(self, size: int = -1, /) -> bytes:
                store.reading.set()
                store.reads += 1
                data = self.source.read(min(size, 64 * 1024))
                threading.Event().wait(0.01)
                return data

        @contextlib.contextmanager
        def opened() -> Iterator[Gate]:
            with self.inner.open(location) as source:
                yield Gate(source)

        return opened()


async def test_cancelling_an_import_stops_the_transfer_and_leaves_nothing(tmp_path: Path, backend: Backend) -> None:
    build = job(tmp_path, backend, "build")
    await publish(build, 0, {"big.bin": os.urandom(8 * 1024 * 1024)})
    deploy = job(tmp_path, backend, "deploy", {"build": need(build)})
    gated = GatedStore(deploy.store())
    deploy._store = gated  # the one seam a test may reach into: the store instance
    task = asyncio.create_task(deploy.import_artifact("jobs.build.artifacts.big.bin", "big.bin", lambda line: None))
    assert await asyncio.to_thread(gated.reading.wait, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert list(deploy.workspace.path.iterdir()) == []
    reads = gated.reads
    await asyncio.sleep(0.1)
    assert gated.reads == reads, "the transfer went on after the cancellation returned"
    assert reads < 8 * 16, "the transfer was not stopped early"
