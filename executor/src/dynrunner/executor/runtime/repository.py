"""Moved to `dynrunner.proto.artifacts.repository` (the cache server in the controller uses the store too,
and the controller does not carry the executor); this name stays for code still importing it."""

from dynrunner.proto.artifacts.repository import Repository, RepositoryError, check_run_id

__all__ = ["Repository", "RepositoryError", "check_run_id"]
