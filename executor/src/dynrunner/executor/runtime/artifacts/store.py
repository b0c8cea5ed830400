"""Moved to `dynrunner.proto.artifacts.store` (the cache server in the controller uses the store too,
and the controller does not carry the executor); this name stays for code still importing it."""

from dynrunner.proto.artifacts.store import (
    CHUNK,
    DEFAULT_MAX_SIZE,
    DRIVERS,
    ArtifactStore,
    Cancelled,
    HashingWriter,
    Producer,
    Readable,
    Scope,
    StoredBlob,
    Writable,
    chunks,
    open_store,
)

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
