"""Artifact refs: what a job publishes through its reserved output and what a dependent job imports.

A ref is immutable and content-addressed: `{name, driver, type, location, digest, size}`. The
reserved job output `dynrunner_artifacts` carries a job's refs as compact JSON,
`{"v":1,"refs":[{...}, ...]}`, so dependent jobs receive them through Gitea's
`needs.<job>.outputs` (Gitea stores a value of at most 1 MiB; a ref takes about 250 bytes).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynrunner.proto.artifacts.errors import ArtifactError

ARTIFACTS_OUTPUT_KEY = "dynrunner_artifacts"
REFS_VERSION = 1
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_JOB_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_MAX_NAME_BYTES = 255


class ArtifactType(enum.StrEnum):
    FILE = "File"
    DIRECTORY = "Directory"


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    name: str
    driver: str
    type: ArtifactType
    location: str
    digest: str
    size: int
    job: str = field(default="", compare=False)
    """The job that published it (known on the consuming side; not part of the encoded ref)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "driver": self.driver,
            "type": self.type.value,
            "location": self.location,
            "digest": self.digest,
            "size": self.size,
        }

    @classmethod
    def from_json(cls, obj: object, *, job: str = "") -> ArtifactRef:
        where = f"an artifact ref of job '{job}'" if job else "an artifact ref"
        if not isinstance(obj, Mapping):
            raise ArtifactError(f"{where} is not an object: {obj!r:.100}")
        try:
            name, driver, kind, location, digest, size = (
                obj["name"],
                obj["driver"],
                obj["type"],
                obj["location"],
                obj["digest"],
                obj["size"],
            )
        except KeyError as err:
            raise ArtifactError(f"{where} lacks the field {err}") from None
        if not all(isinstance(v, str) for v in (name, driver, kind, location, digest)):
            raise ArtifactError(f"{where} has a field that is not a string")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ArtifactError(f"{where} has an invalid size {size!r}")
        try:
            artifact_type = ArtifactType(kind)
        except ValueError:
            raise ArtifactError(f"{where} has an unknown type {kind!r} (File or Directory)") from None
        if not DIGEST_RE.fullmatch(digest):
            raise ArtifactError(f"{where} has an invalid digest {digest!r:.100} (expected sha256:<64 hex digits>)")
        try:
            check_name(name)
        except ArtifactError as err:
            raise ArtifactError(f"{where}: {err}") from None
        return cls(name, driver, artifact_type, location, digest, size, job)


def check_name(name: str) -> str:
    """An artifact name is one path component: the entry's name at the top of KRUNTIME_ARTIFACTS_DIR."""
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise ArtifactError(f"artifact name {name!r} is not valid UTF-8") from None
    if not name or name in {".", ".."} or "/" in name or "\\" in name:
        raise ArtifactError(f"artifact name {name!r} must be one file or directory name (no '/', '\\', '.' or '..')")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ArtifactError(f"artifact name {name!r} contains a control character")
    if size > _MAX_NAME_BYTES:
        raise ArtifactError(f"artifact name {name[:40]!r}… is {size} bytes; the limit is {_MAX_NAME_BYTES}")
    return name


def encode_refs(refs: Iterable[ArtifactRef]) -> str:
    ordered = sorted(refs, key=lambda r: r.name)
    return json.dumps({"v": REFS_VERSION, "refs": [r.to_json() for r in ordered]}, separators=(",", ":"))


def decode_refs(value: str, *, job: str) -> dict[str, ArtifactRef]:
    """The refs a job published, by name. Raises ArtifactError naming the job for anything malformed."""
    try:
        doc = json.loads(value)
    except ValueError as err:
        raise ArtifactError(f"output '{ARTIFACTS_OUTPUT_KEY}' of job '{job}' is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("v") != REFS_VERSION or not isinstance(doc.get("refs"), list):
        raise ArtifactError(
            f"output '{ARTIFACTS_OUTPUT_KEY}' of job '{job}' is not a version {REFS_VERSION} artifact list; "
            "was it written by a different dynrunner version or by hand?"
        )
    refs: dict[str, ArtifactRef] = {}
    for item in doc["refs"]:
        ref = ArtifactRef.from_json(item, job=job)
        if ref.name in refs:
            raise ArtifactError(f"job '{job}' published artifact '{ref.name}' twice")
        refs[ref.name] = ref
    return refs


def parse_from(value: str) -> tuple[str, str]:
    """`jobs.<job-id>.artifacts.<name>` as (job id, artifact name); the name may contain dots."""
    parts = value.split(".", 3)
    if len(parts) != 4 or parts[0] != "jobs" or parts[2] != "artifacts" or not parts[3]:
        raise ArtifactError(f"'{value}' is not of the form jobs.<job-id>.artifacts.<name>")
    job, name = parts[1], parts[3]
    if not _JOB_RE.fullmatch(job):
        raise ArtifactError(f"'{job}' in '{value}' is not a job id")
    return job, check_name(name)
