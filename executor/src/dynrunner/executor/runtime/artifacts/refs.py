"""Moved to `dynrunner.proto.artifacts.refs` (the cache server in the controller uses the store too,
and the controller does not carry the executor); this name stays for code still importing it."""

from dynrunner.proto.artifacts.refs import (
    ARTIFACTS_OUTPUT_KEY,
    DIGEST_RE,
    REFS_VERSION,
    ArtifactRef,
    ArtifactType,
    check_name,
    decode_refs,
    encode_refs,
    parse_from,
)

__all__ = [
    "ARTIFACTS_OUTPUT_KEY",
    "DIGEST_RE",
    "REFS_VERSION",
    "ArtifactRef",
    "ArtifactType",
    "check_name",
    "decode_refs",
    "encode_refs",
    "parse_from",
]
