"""Opening the ArtifactStore an assignment names: the driver registry.

`DRIVERS` maps a driver's name (the assignment's `artifacts.driver`) to the function that opens
it; each imports its driver module only when called, so the S3 driver (and boto3) loads only for
a job that uses it. The drivers implement the seam in `base` (the interface, content addresses,
the hashing writer), which this module also exports for the code that uses a store.
"""

from __future__ import annotations

from collections.abc import Callable

from dynrunner.proto.artifacts.base import (
    CHUNK,
    ArtifactStore,
    Cancelled,
    HashingWriter,
    Producer,
    Readable,
    Scope,
    StoredBlob,
    Writable,
    chunks,
)
from dynrunner.proto.artifacts.errors import ArtifactError
from dynrunner.proto.assignment import ArtifactStoreOptions

DEFAULT_MAX_SIZE = 10 * 1024**3
"""Largest artifact accepted when the assignment sets no `max_size_bytes`."""


def _filesystem(options: ArtifactStoreOptions, scope: Scope, max_size: int) -> ArtifactStore:
    from dynrunner.proto.artifacts.filesystem import FilesystemStore

    return FilesystemStore(options.path, scope, max_size)


def _s3(options: ArtifactStoreOptions, scope: Scope, max_size: int) -> ArtifactStore:
    from dynrunner.proto.artifacts.s3 import S3Store

    return S3Store(options, scope, max_size)


DRIVERS: dict[str, Callable[[ArtifactStoreOptions, Scope, int], ArtifactStore]] = {
    "Filesystem": _filesystem,
    "S3": _s3,
}


def open_store(options: ArtifactStoreOptions, scope: Scope) -> ArtifactStore:
    """The configured store for this job's scope."""
    opener = DRIVERS.get(options.driver)
    if opener is not None:
        return opener(options, scope, options.max_size_bytes or DEFAULT_MAX_SIZE)
    if not options.driver:
        raise ArtifactError("no artifact store is configured for this runner (artifacts.driver is empty)")
    raise ArtifactError(f"unknown artifact store driver {options.driver!r}; known drivers: {', '.join(DRIVERS)}")


__all__ = [
    "CHUNK",
    "DEFAULT_MAX_SIZE",
    "DRIVERS",
    "ArtifactStore",
    "Cancelled",
    "HashingWriter",
    "Producer",
    "Readable",
    "Scope",
    "StoredBlob",
    "Writable",
    "chunks",
    "open_store",
]
