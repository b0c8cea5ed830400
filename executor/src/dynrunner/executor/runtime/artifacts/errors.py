"""Moved to `dynrunner.proto.artifacts.errors` (the cache server in the controller uses the store too,
and the controller does not carry the executor); this name stays for code still importing it."""

from dynrunner.proto.artifacts.errors import ArtifactError, ScopeError, StagingError

__all__ = ["ArtifactError", "ScopeError", "StagingError"]
