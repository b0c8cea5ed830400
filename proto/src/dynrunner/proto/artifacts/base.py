"""The ArtifactStore seam: the interface every driver implements and what drivers share.

Stores are blocking (the runtime calls them in a worker thread) and stream: a blob is produced
chunk by chunk into a writer that hashes as it goes, and read back chunk by chunk. Every blob
lives at a content address inside the job's scope,

    <owner>/<repo>/<run_id>/sha256/<hex digest>

relative to the store's base (Filesystem: its root path; S3: bucket + prefix). Refs carry this
relative location, so they stay valid wherever the store is mounted, and a ref whose location is
not in the job's repository is refused before anything is read.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from dynrunner.proto.artifacts.errors import ArtifactError, ScopeError
from dynrunner.proto.artifacts.refs import ArtifactRef
from dynrunner.proto.artifacts.repository import Repository, check_run_id

CHUNK = 1024 * 1024

_LOCATION_RE = re.compile(r"^([^/]+)/([^/]+)/([A-Za-z0-9_-]{1,64})/sha256/([0-9a-f]{64})$")


class Cancelled(ArtifactError):
    """The job is being cancelled; the transfer stopped and left nothing published."""


class Writable(Protocol):
    def write(self, data: bytes, /) -> object: ...


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


Producer = Callable[[Writable], object]
"""Writes an artifact's bytes into a writer. Calling it again writes the same bytes (archives are
deterministic), which lets a driver hash first and upload second."""


@dataclass(frozen=True, slots=True)
class Scope:
    repository: Repository
    run_id: str

    def __post_init__(self) -> None:
        check_run_id(self.run_id)

    @property
    def prefix(self) -> str:
        return self.repository.scope

    def location(self, digest: str) -> str:
        return f"{self.prefix}/{self.run_id}/sha256/{digest.removeprefix('sha256:')}"

    def owns(self, location: str) -> bool:
        match = _LOCATION_RE.fullmatch(location)
        return match is not None and f"{match.group(1)}/{match.group(2)}" == self.prefix

    def check(self, ref: ArtifactRef, driver: str | None = None) -> str:
        """The ref's location once it is known to be this repository's content address for its digest
        (and, given `driver`, stored by that driver)."""
        source = f"artifact '{ref.name}'" + (f" of job '{ref.job}'" if ref.job else "")
        if driver is not None and ref.driver != driver:
            raise ScopeError(f"{source} is stored with driver {ref.driver!r}, but this runner's store is {driver!r}")
        match = _LOCATION_RE.fullmatch(ref.location)
        if not match:
            raise ScopeError(f"{source} has location {ref.location!r:.200}, which is not a content address")
        owner, repo, _run, hexdigest = match.groups()
        if f"{owner}/{repo}" != self.prefix:
            raise ScopeError(
                f"{source} belongs to repository '{owner}/{repo}', not to '{self.repository}'; "
                "a job can only read its own repository's artifacts"
            )
        if ref.digest != f"sha256:{hexdigest}":
            raise ScopeError(f"{source} has location {ref.location!r}, which does not match its digest {ref.digest}")
        return ref.location


@dataclass(frozen=True, slots=True)
class StoredBlob:
    location: str
    digest: str
    size: int


class ArtifactStore(Protocol):
    driver: str
    scope: Scope
    max_size: int

    def put(self, producer: Producer, stop: threading.Event) -> StoredBlob:
        """Store the produced bytes at their content address; published only once complete and hashed."""
        ...

    def open(self, location: str) -> AbstractContextManager[Readable]:
        """A stream of the blob at a location `Scope.check` accepted."""
        ...

    def delete(self, location: str) -> None:
        """Remove the blob at a location of this scope; a blob already gone is no error. Jobs never
        delete (artifacts are immutable for a run); the cache server evicts entries with it."""
        ...


class HashingWriter:
    """Counts, hashes and forwards bytes; stops at `max_size` and when `stop` is set."""

    def __init__(self, target: Writable | None, max_size: int, stop: threading.Event, what: str) -> None:
        self._target = target
        self._max = max_size
        self._stop = stop
        self._what = what
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes, /) -> int:
        if self._stop.is_set():
            raise Cancelled(f"{self._what}: cancelled")
        self.size += len(data)
        if self.size > self._max:
            raise ArtifactError(f"{self._what} is larger than {self._max} bytes, the store's limit for one artifact")
        self._hash.update(data)
        if self._target is not None:
            self._target.write(data)
        return len(data)

    @property
    def digest(self) -> str:
        return f"sha256:{self._hash.hexdigest()}"


def chunks(reader: Readable, stop: threading.Event) -> Iterator[bytes]:
    while data := reader.read(CHUNK):
        if stop.is_set():
            raise Cancelled("transfer cancelled")
        yield data
