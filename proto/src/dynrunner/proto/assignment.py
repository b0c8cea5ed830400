"""The Assignment contract (`dynrunner.assignment.v1`) as typed values.

Controller and executor work with these dataclasses; protobuf bytes appear only in
`encode`/`decode`. On JetStream an assignment travels sealed whole in a `SealedAssignment`
envelope (`encode_sealed`/`decode_sealed`; the controller seals and opens it). `split_secrets`
and `merge_secrets` separate the secret parts from the rest (the previous, unauthenticated
wire format sealed only those).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from dynrunner.proto._gen.dynrunner.assignment.v1 import assignment_pb2 as apb
from dynrunner.proto._gen.dynrunner.assignment.v1 import envelope_pb2 as epb
from dynrunner.proto.gitea.types import Task, ts_from_proto, ts_to_proto

VERSION = 1
"""The major version this code writes and understands."""
ENVELOPE_FORMAT = 1
"""The `SealedAssignment` format this code writes and understands."""

JOB_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
TOKEN_CONTEXT_KEYS = ("token", "gitea_runtime_token")


class AssignmentError(ValueError):
    """The assignment cannot be read or is not one this executor understands."""


@dataclass(frozen=True, slots=True)
class ClaimingRunner:
    id: int
    uuid: str
    token: str
    name: str = ""
    labels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ArtifactStoreOptions:
    driver: str = ""
    path: str = ""
    bucket: str = ""
    prefix: str = ""
    endpoint: str = ""
    region: str = ""
    max_size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class IdentityWait:
    enabled: bool = False
    workload_api_socket: str = ""
    timeout_seconds: int = 0


@dataclass(frozen=True, slots=True)
class CacheServiceOptions:
    url: str = ""
    v2: bool = False
    grant: str = ""


@dataclass(frozen=True, slots=True)
class ExecutorOptions:
    workspace: str = ""
    artifacts: ArtifactStoreOptions = field(default_factory=ArtifactStoreOptions)
    identity: IdentityWait = field(default_factory=IdentityWait)
    outputs_total_limit_bytes: int = 0
    log_level: str = ""
    cache: CacheServiceOptions = field(default_factory=CacheServiceOptions)


@dataclass(frozen=True, slots=True)
class Sealed:
    key_id: str
    nonce: bytes
    ciphertext: bytes


@dataclass(frozen=True, slots=True)
class Assignment:
    """See proto/protos/dynrunner/assignment/v1/assignment.proto for every field's meaning."""

    assignment_id: str
    pool: str
    backend: str
    claimed_at: datetime
    task: Task
    runner: ClaimingRunner
    gitea_url: str
    job_key: str
    spiffe_id: str = ""
    deadline: datetime | None = None
    executor: ExecutorOptions = field(default_factory=ExecutorOptions)
    sealed: Sealed | None = None
    version: int = VERSION

    def replace(self, **changes: object) -> Assignment:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class SecretParts:
    task_secrets: dict[str, str]
    runner_token: str
    task_token: str
    runtime_token: str


def encode(a: Assignment) -> bytes:
    msg = apb.Assignment(
        version=a.version,
        assignment_id=a.assignment_id,
        pool=a.pool,
        backend=a.backend,
        claimed_at=ts_to_proto(a.claimed_at),
        task=a.task.to_proto(),
        runner=apb.ClaimingRunner(
            id=a.runner.id, uuid=a.runner.uuid, token=a.runner.token, name=a.runner.name, labels=a.runner.labels
        ),
        gitea_url=a.gitea_url,
        job_key=a.job_key,
        spiffe_id=a.spiffe_id,
        deadline=ts_to_proto(a.deadline),
        executor=apb.ExecutorOptions(
            workspace=a.executor.workspace,
            artifacts=apb.ArtifactStore(**_fields_of(a.executor.artifacts)),
            identity=apb.IdentityWait(**_fields_of(a.executor.identity)),
            outputs_total_limit_bytes=a.executor.outputs_total_limit_bytes,
            log_level=a.executor.log_level,
            cache=apb.CacheService(**_fields_of(a.executor.cache)),
        ),
    )
    if a.sealed is not None:
        msg.sealed.CopyFrom(apb.Sealed(key_id=a.sealed.key_id, nonce=a.sealed.nonce, ciphertext=a.sealed.ciphertext))
    return msg.SerializeToString(deterministic=True)


def _fields_of(options: ArtifactStoreOptions | IdentityWait | CacheServiceOptions) -> dict[str, Any]:
    """A flat options dataclass as keyword arguments (`dataclasses.asdict` deep-copies: slow)."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


def peek_version(data: bytes) -> int:
    """The major version of an encoded assignment, read before anything else is trusted."""
    try:
        return apb.Assignment.FromString(data).version
    except DecodeError as err:
        raise AssignmentError(f"assignment is not a valid dynrunner.assignment.v1 message: {err}") from err


@dataclass(frozen=True, slots=True)
class ReportingEnvelope:
    """The fields every major version keeps at the same numbers (assignment_id, task.id,
    runner, gitea_url), so an executor can still tell Gitea *why* it refuses an assignment."""

    assignment_id: str
    task_id: int
    runner: ClaimingRunner
    gitea_url: str
    version: int


def decode_envelope(data: bytes) -> ReportingEnvelope:
    """Read only the version-independent fields; raises AssignmentError if even those are unreadable."""
    try:
        msg = apb.Assignment.FromString(data)
    except DecodeError as err:
        raise AssignmentError(f"assignment is not a valid dynrunner.assignment.v1 message: {err}") from err
    if not msg.task.id or not msg.runner.uuid or not msg.gitea_url:
        raise AssignmentError("assignment lacks task id, runner or gitea_url; nothing can be reported")
    return ReportingEnvelope(
        assignment_id=msg.assignment_id,
        task_id=msg.task.id,
        runner=_runner(msg.runner),
        gitea_url=msg.gitea_url,
        version=msg.version,
    )


def decode(data: bytes) -> Assignment:
    """Parse and check an encoded assignment; raises AssignmentError with a readable reason."""
    try:
        msg = apb.Assignment.FromString(data)
    except DecodeError as err:
        raise AssignmentError(f"assignment is not a valid dynrunner.assignment.v1 message: {err}") from err
    if msg.version != VERSION:
        raise AssignmentError(
            f"assignment version {msg.version} is not supported by this executor (it understands version {VERSION}); "
            "upgrade the executor image to match the controller"
        )
    claimed_at = ts_from_proto(msg, "claimed_at")
    if not msg.assignment_id or claimed_at is None or not msg.HasField("task") or not msg.HasField("runner"):
        raise AssignmentError("assignment lacks assignment_id, claimed_at, task or runner")
    ex = msg.executor
    sealed = (
        Sealed(key_id=msg.sealed.key_id, nonce=msg.sealed.nonce, ciphertext=msg.sealed.ciphertext)
        if msg.HasField("sealed")
        else None
    )
    return Assignment(
        version=msg.version,
        assignment_id=msg.assignment_id,
        pool=msg.pool,
        backend=msg.backend,
        claimed_at=claimed_at,
        task=Task.from_proto(msg.task),
        runner=_runner(msg.runner),
        gitea_url=msg.gitea_url,
        job_key=msg.job_key,
        spiffe_id=msg.spiffe_id,
        deadline=ts_from_proto(msg, "deadline"),
        executor=ExecutorOptions(
            workspace=ex.workspace,
            artifacts=ArtifactStoreOptions(
                driver=ex.artifacts.driver,
                path=ex.artifacts.path,
                bucket=ex.artifacts.bucket,
                prefix=ex.artifacts.prefix,
                endpoint=ex.artifacts.endpoint,
                region=ex.artifacts.region,
                max_size_bytes=ex.artifacts.max_size_bytes,
            ),
            identity=IdentityWait(
                enabled=ex.identity.enabled,
                workload_api_socket=ex.identity.workload_api_socket,
                timeout_seconds=ex.identity.timeout_seconds,
            ),
            outputs_total_limit_bytes=ex.outputs_total_limit_bytes,
            log_level=ex.log_level,
            cache=CacheServiceOptions(url=ex.cache.url, v2=ex.cache.v2, grant=ex.cache.grant),
        ),
        sealed=sealed,
    )


@dataclass(frozen=True, slots=True)
class EnvelopeHeader:
    """The readable (and authenticated) part of a `SealedAssignment`."""

    assignment_id: str
    pool: str
    task_id: int
    key_id: str
    format: int = ENVELOPE_FORMAT

    def to_bytes(self) -> bytes:
        return epb.SealedAssignmentHeader(
            format=self.format,
            assignment_id=self.assignment_id,
            pool=self.pool,
            task_id=self.task_id,
            key_id=self.key_id,
        ).SerializeToString(deterministic=True)


@dataclass(frozen=True, slots=True)
class SealedAssignment:
    """An assignment as it travels on JetStream. `header_bytes` are the header exactly as
    carried: what the seal authenticates (`header` is parsed from them)."""

    header: EnvelopeHeader
    header_bytes: bytes
    nonce: bytes
    ciphertext: bytes

    @property
    def assignment_id(self) -> str:
        return self.header.assignment_id

    @property
    def pool(self) -> str:
        return self.header.pool

    @property
    def task_id(self) -> int:
        return self.header.task_id


class NotAnEnvelope(AssignmentError):
    """The bytes are no `SealedAssignment`. `previous_format` when they are an Assignment as the
    previous wire format carried it (only its secrets sealed, everything else forgeable)."""

    def __init__(self, message: str, *, previous_format: bool = False) -> None:
        super().__init__(message)
        self.previous_format = previous_format


class NewerEnvelope(AssignmentError):
    """A `SealedAssignment` of a format newer than `ENVELOPE_FORMAT` (from a newer controller)."""


def encode_sealed(sealed: SealedAssignment) -> bytes:
    return epb.SealedAssignment(
        header=sealed.header_bytes, nonce=sealed.nonce, ciphertext=sealed.ciphertext
    ).SerializeToString(deterministic=True)


def decode_sealed(data: bytes) -> SealedAssignment:
    """Parse an envelope (nothing in it is authenticated yet). Raises NotAnEnvelope, or
    NewerEnvelope for a format this code does not know."""
    try:
        msg = epb.SealedAssignment.FromString(data)
        header = epb.SealedAssignmentHeader.FromString(msg.header)
    except DecodeError as err:
        raise NotAnEnvelope(f"not a sealed assignment: {err}", previous_format=_previous_format(data)) from None
    if not msg.header or not header.format or not header.assignment_id or not msg.ciphertext:
        previous = _previous_format(data)
        what = "an assignment in the previous, unauthenticated format" if previous else "not a sealed assignment"
        raise NotAnEnvelope(what, previous_format=previous)
    if header.format > ENVELOPE_FORMAT:
        raise NewerEnvelope(
            f"sealed assignment format {header.format} is newer than this controller's ({ENVELOPE_FORMAT})"
        )
    return SealedAssignment(
        header=EnvelopeHeader(
            assignment_id=header.assignment_id,
            pool=header.pool,
            task_id=header.task_id,
            key_id=header.key_id,
            format=header.format,
        ),
        header_bytes=msg.header,
        nonce=msg.nonce,
        ciphertext=msg.ciphertext,
    )


def _previous_format(data: bytes) -> bool:
    """An Assignment written directly onto the stream, as before envelopes existed."""
    try:
        msg = apb.Assignment.FromString(data)
    except DecodeError:
        return False
    return msg.version == VERSION and bool(msg.assignment_id) and msg.HasField("task") and msg.HasField("sealed")


def split_secrets(a: Assignment) -> tuple[Assignment, bytes]:
    """Blank the secret parts of `a`; return the blanked copy and the parts serialized
    (for the controller to seal with the assignment id as associated data)."""
    parts = apb.SecretParts(
        task_secrets=dict(a.task.secrets),
        runner_token=a.runner.token,
        task_token=str(a.task.context_get("token", "")),
        runtime_token=str(a.task.context_get("gitea_runtime_token", "")),
    )
    task = a.task.with_context(drop=TOKEN_CONTEXT_KEYS)
    public = a.replace(
        task=task.replace(secrets={}),
        runner=dataclasses.replace(a.runner, token=""),
    )
    return public, parts.SerializeToString(deterministic=True)


def merge_secrets(a: Assignment, parts_bytes: bytes) -> Assignment:
    """Put unsealed secret parts back and drop the sealed blob."""
    parts = apb.SecretParts.FromString(parts_bytes)
    tokens = {"token": parts.task_token, "gitea_runtime_token": parts.runtime_token}
    task = a.task.with_context(add={k: v for k, v in tokens.items() if v})
    return a.replace(
        task=task.replace(secrets=dict(parts.task_secrets)),
        runner=dataclasses.replace(a.runner, token=parts.runner_token),
        sealed=None,
    )


def context_struct(context: dict[str, object]) -> struct_pb2.Struct:
    """A `github` context as a protobuf Struct (for tests and the double)."""
    msg = struct_pb2.Struct()
    msg.update(context)
    return msg


def _runner(msg: apb.ClaimingRunner) -> ClaimingRunner:
    return ClaimingRunner(id=msg.id, uuid=msg.uuid, token=msg.token, name=msg.name, labels=tuple(msg.labels))
