"""Moved to `dynrunner.proto.artifacts.s3` (the cache server in the controller uses the store too,
and the controller does not carry the executor); this name stays for code still importing it."""

from dynrunner.proto.artifacts.s3 import MAX_PARTS, PARALLEL_PARTS, PART_SIZE, S3Store

__all__ = ["MAX_PARTS", "PARALLEL_PARTS", "PART_SIZE", "S3Store"]
