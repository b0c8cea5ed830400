"""Shared by the staging tests: a producing job's store and a consuming job's runtime on one temp dir."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dynrunner.executor.runtime import JobRuntime
from dynrunner.executor.runtime.artifacts.refs import ARTIFACTS_OUTPUT_KEY, ArtifactRef, ArtifactType, encode_refs
from dynrunner.executor.runtime.artifacts.store import Scope, Writable, open_store
from dynrunner.executor.runtime.repository import Repository
from dynrunner.proto.assignment import ArtifactStoreOptions
from dynrunner.proto.gitea.types import Need, Result


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **attrs: object
) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    info.mode = 0o644 if kind != tarfile.DIRTYPE else 0o755
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, (data if info.size else None)


@dataclass
class Scene:
    """A consuming job's workspace, an `outside` directory a staging attack would like to reach, and the store."""

    tmp: Path
    options: ArtifactStoreOptions
    outside: Path

    def publish(
        self, name: str, data: bytes, kind: ArtifactType = ArtifactType.DIRECTORY, **ref_changes: object
    ) -> ArtifactRef:
        store = open_store(self.options, Scope(Repository.parse("owner/repo"), "5"))
        blob = store.put(lambda out: _write(out, data), threading.Event())
        values: dict[str, object] = {
            "name": name,
            "driver": "Filesystem",
            "type": kind,
            "location": blob.location,
            "digest": blob.digest,
            "size": blob.size,
        }
        values.update(ref_changes)
        return ArtifactRef(**values)  # type: ignore[arg-type]

    def tamper(self, ref: ArtifactRef, data: bytes) -> None:
        """Replace a stored blob's bytes, as someone with write access to the store could."""
        blob = Path(self.options.path, ref.location)
        blob.chmod(0o644)
        blob.write_bytes(data)

    def runtime(self, *refs: ArtifactRef, max_size: int = 0) -> JobRuntime:
        options = ArtifactStoreOptions(driver="Filesystem", path=self.options.path, max_size_bytes=max_size)
        needs = {"build": Need(outputs={ARTIFACTS_OUTPUT_KEY: encode_refs(refs)}, result=Result.SUCCESS)}
        return JobRuntime.create(
            self.tmp / "job", repository="owner/repo", run_id="5", job_key="deploy", artifacts=options, needs=needs
        )

    def snapshot(self) -> dict[str, str]:
        """Every path under the temp dir except the store, with its kind and content digest."""
        seen: dict[str, str] = {}
        store = Path(self.options.path)
        for directory, dirs, files in os.walk(self.tmp):
            if Path(directory) == store or Path(directory).is_relative_to(store):
                continue
            for name in dirs + files:
                path = Path(directory, name)
                if path.is_symlink():
                    seen[str(path)] = f"link:{os.readlink(path)}"
                elif path.is_file():
                    seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
                else:
                    seen[str(path)] = "dir" if path.is_dir() else "other"
        return seen


def _write(out: Writable, data: bytes) -> None:
    out.write(data)


def make_scene(tmp_path: Path) -> Scene:
    store = tmp_path / "store"
    store.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("do not touch")
    return Scene(tmp_path, ArtifactStoreOptions(driver="Filesystem", path=str(store)), outside)
