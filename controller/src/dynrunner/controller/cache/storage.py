"""Where cache archives live: staged uploads on the server's disk, published archives in the
ArtifactStore (the executors' drivers: Filesystem or S3), one store scope per repository.

An upload arrives in pieces: v1 PATCHes byte ranges (several in parallel, in any order); v2
uses the Azure blob protocol (one Put Blob, or blocks put in any order and then a block list
that orders them). Pieces are staged under `<staging>/<entry id>/`; committing assembles them
in order, streams the result into the store (content-addressed, so identical archives are
stored once) and drops the staging. All methods block: the server calls them in threads.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from dynrunner.proto.artifacts.repository import Repository
from dynrunner.proto.artifacts.store import ArtifactStore, Readable, Scope, StoredBlob, Writable, open_store
from dynrunner.proto.assignment import ArtifactStoreOptions

RUN_SCOPE = "cache"
"""The store scope's run segment: archives live at `<owner>/<repo>/cache/sha256/<digest>`."""
READ_CHUNK = 1024 * 1024


class UploadError(ValueError):
    """The staged pieces do not make a whole archive (a gap, a size that disagrees, too large)."""


class CacheStorage:
    def __init__(self, options: ArtifactStoreOptions, staging: Path, max_entry_bytes: int) -> None:
        self.options = dataclasses.replace(options, max_size_bytes=max_entry_bytes)
        self.staging = staging
        self.max_entry_bytes = max_entry_bytes
        staging.mkdir(parents=True, exist_ok=True)
        self._stores: dict[str, ArtifactStore] = {}
        self._lock = threading.Lock()

    def store(self, repo: str) -> ArtifactStore:
        with self._lock:
            if repo not in self._stores:
                self._stores[repo] = open_store(self.options, Scope(Repository.parse(repo), RUN_SCOPE))
            return self._stores[repo]

    # -- staging ------------------------------------------------------------------------------

    def _dir(self, entry_id: int) -> Path:
        return self.staging / str(entry_id)

    def range_file(self, entry_id: int, start: int) -> Path:
        """Where a v1 byte range starting at `start` is staged."""
        if start < 0 or start >= self.max_entry_bytes:
            raise UploadError(f"a range starting at byte {start} is outside the {self.max_entry_bytes}-byte limit")
        path = self._dir(entry_id) / "ranges" / f"{start:020d}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def block_file(self, entry_id: int, block_id: str) -> Path:
        """Where a v2 block is staged (the id is opaque base64; its own base64url names the file)."""
        name = base64.urlsafe_b64encode(block_id.encode()).decode()
        if len(name) > 200:
            raise UploadError("block id too long")
        path = self._dir(entry_id) / "blocks" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def whole_file(self, entry_id: int) -> Path:
        """Where a v2 single-shot upload (Put Blob) is staged."""
        path = self._dir(entry_id) / "whole"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def order_blocks(self, entry_id: int, block_ids: list[str]) -> None:
        for block_id in block_ids:
            if not self.block_file(entry_id, block_id).exists():
                raise UploadError(f"the block list names block {block_id!r}, which was never uploaded")
        (self._dir(entry_id) / "order").write_text("\n".join(block_ids))

    def _pieces(self, entry_id: int) -> list[Path]:
        """The staged files in order, or UploadError when they leave a gap."""
        directory = self._dir(entry_id)
        order = directory / "order"
        if order.exists():
            ids = [line for line in order.read_text().split("\n") if line]
            return [self.block_file(entry_id, block_id) for block_id in ids]
        if (directory / "whole").exists():
            return [directory / "whole"]
        ranges = sorted((directory / "ranges").glob("*")) if (directory / "ranges").is_dir() else []
        at = 0
        for path in ranges:
            start = int(path.name)
            if start != at:
                raise UploadError(f"the upload has a gap: nothing was uploaded for bytes {at}..{start - 1}")
            at += path.stat().st_size
        return ranges

    def staged_bytes(self, entry_id: int) -> int:
        """Bytes on disk for `entry_id`'s upload so far, every piece counted (used or not)."""
        directory = self._dir(entry_id)
        return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file()) if directory.is_dir() else 0

    def staged_size(self, entry_id: int) -> int:
        return sum(path.stat().st_size for path in self._pieces(entry_id))

    def publish(self, repo: str, entry_id: int, expected_size: int | None) -> StoredBlob:
        """Assemble the staged pieces into the store; the staging goes either way."""
        try:
            pieces = self._pieces(entry_id)
            size = sum(path.stat().st_size for path in pieces)
            if expected_size is not None and expected_size >= 0 and size != expected_size:
                raise UploadError(f"{size} bytes were uploaded, but the client says the archive has {expected_size}")
            if size > self.max_entry_bytes:
                raise UploadError(f"the archive has {size} bytes, over this cache's limit of {self.max_entry_bytes}")

            def produce(out: Writable) -> None:
                for path in pieces:
                    with open(path, "rb") as source:
                        while chunk := source.read(READ_CHUNK):
                            out.write(chunk)

            return self.store(repo).put(produce, threading.Event())
        finally:
            self.discard(entry_id)

    def discard(self, entry_id: int) -> None:
        shutil.rmtree(self._dir(entry_id), ignore_errors=True)

    def staged_ids(self) -> set[int]:
        return {int(p.name) for p in self.staging.iterdir() if p.name.isdigit()}

    # -- published -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def open(self, repo: str, location: str) -> Iterator[Readable]:
        with self.store(repo).open(location) as stream:
            yield stream

    def delete(self, repo: str, location: str) -> None:
        self.store(repo).delete(location)
