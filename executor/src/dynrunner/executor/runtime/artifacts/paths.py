"""Moved to `dynrunner.proto.artifacts.paths` (the cache server in the controller uses the store too,
and the controller does not carry the executor); this name stays for code still importing it."""

from dynrunner.proto.artifacts.paths import DIR_FLAGS, MissingPath, open_dir, opened_dir, relative_parts

__all__ = ["DIR_FLAGS", "MissingPath", "open_dir", "opened_dir", "relative_parts"]
