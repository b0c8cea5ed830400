"""Moved to `dynrunner.proto.artifacts.filesystem` (the cache server in the controller uses the store too,
and the controller does not carry the executor); this name stays for code still importing it."""

from dynrunner.proto.artifacts.filesystem import FilesystemStore

__all__ = ["FilesystemStore"]
