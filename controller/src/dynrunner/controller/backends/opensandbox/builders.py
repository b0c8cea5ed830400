"""One job's sandbox as pure functions of (assignment, pool settings): its create request, its
metadata (the `dynrunner.io/*` labels spelled as OpenSandbox metadata), its expiry, and the
files delivered into it.

Metadata keys are plain DNS labels (`dynrunner-assignment-id`): OpenSandbox takes Kubernetes
label keys, but its microVM templates (fsb) only plain ones. Beside the contract's labels a
sandbox carries its job's deadline (`dynrunner-deadline`, Unix seconds) and how far the
handover went (`dynrunner-stage`): `created` (the sandbox exists, nothing is in it yet),
`staged` (the delivery waits in it, the executor has not started), `delivered` (the
entrypoint has it: the executor runs or ran). Nothing secret is in metadata or env.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from dynrunner.controller import contract
from dynrunner.controller.backends.opensandbox.config import NetworkPolicy, OpenSandboxBackendConfig
from dynrunner.controller.config.model import ControllerConfig, PoolConfig
from dynrunner.proto.assignment import Assignment

METADATA_PREFIX = "dynrunner-"
KEY_STAGE = "dynrunner-stage"
KEY_DEADLINE = "dynrunner-deadline"
STAGE_CREATED = "created"
STAGE_STAGED = "staged"
STAGE_DELIVERED = "delivered"
STAGES = (STAGE_CREATED, STAGE_STAGED, STAGE_DELIVERED)

DELIVERY_DIR = "/run/dynrunner/delivery"
"""Where the VM's entrypoint waits for its job (vm/README.md, "The contract")."""
PARTIAL_DIR = DELIVERY_DIR + ".partial"
ASSIGNMENT_FILE = "assignment.pb"
TOKEN_FILE = "join-token"
BUNDLE_FILE = "bundle.pem"
STATE_FILE = "/run/dynrunner/reported/accepted-state.pb"
"""Where the executor keeps the task state Gitea last accepted (the entrypoint's
`DYNRUNNER_STATE_FILE`), read through execd before a VM that still runs is deleted."""
STATE_MARKER = "dynrunner-accepted-state: "
"""What starts the console line on which the entrypoint prints that file (base64) when the
executor ended without finalizing: read from the console once the VM has ended."""
ENV_FILE = "env"
S3_ENV = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
)  # fmt: skip
"""boto3's variables that carry values (not paths of the controller's host) for a VM's executor."""
FILE_MODE = 600
"""execd's `mode` is octal digits as a decimal number."""

MIN_TIMEOUT_S = 60
"""The shortest timeout opensandbox-server accepts."""
MAX_DIGITS = 19
"""Task ids, stream sequences and Unix times fit in 19 digits (a signed 64-bit integer)."""
AGENT_ALIAS_PATH = "/dynrunner/agent"
"""Outside `/spire/`: SPIRE refuses an agent ID in its reserved namespace (CreateJoinToken:
INVALID_ARGUMENT, "path is in the reserved namespace")."""


@dataclasses.dataclass(frozen=True, slots=True)
class VmSettings:
    """What the builders need of the configuration, derived once per pool."""

    pool: str
    backend: OpenSandboxBackendConfig
    trust_domain: str
    svid_ttl_s: int = 900
    join_token_ttl_s: int = 900
    artifact_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """With an S3 artifact store, the controller's S3 credentials for the executor (as the
    `local` backend passes them): delivered in the VM, never in the sandbox's env."""

    @classmethod
    def from_config(cls, pool: PoolConfig, config: ControllerConfig) -> VmSettings:
        assert isinstance(pool.backend, OpenSandboxBackendConfig)
        ident = config.identity
        s3 = config.artifacts.driver == "S3"
        return cls(
            pool=pool.name,
            backend=pool.backend,
            trust_domain=ident.trust_domain,
            svid_ttl_s=ident.svid_ttl_s,
            join_token_ttl_s=ident.spire_server.join_token_ttl_s if ident.spire_server else 900,
            artifact_env={name: os.environ[name] for name in S3_ENV if s3 and os.environ.get(name)},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxRequest:
    """What `api.OpenSandboxApi.create` sends (the SDK's create arguments, ours to test)."""

    metadata: Mapping[str, str]
    timeout_s: int
    image: str = ""
    template_id: str = ""
    entrypoint: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    resources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    resource_requests: Mapping[str, str] = dataclasses.field(default_factory=dict)
    network_policy: NetworkPolicy | None = None
    extensions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    secure_access: bool = False


# -- metadata -------------------------------------------------------------------------------------


def metadata_key(label: str) -> str:
    """`dynrunner.io/assignment-id` → `dynrunner-assignment-id`."""
    assert label.startswith(contract.LABEL_PREFIX), label
    return METADATA_PREFIX + label.removeprefix(contract.LABEL_PREFIX)


def sandbox_metadata(assignment: Assignment, stream_seq: int | None = None) -> dict[str, str]:
    """The metadata a job's sandbox is created with (stage `created`)."""
    metadata = {metadata_key(k): v for k, v in contract.environment_labels(assignment, stream_seq).items()}
    metadata[KEY_STAGE] = STAGE_CREATED
    if assignment.deadline is not None:
        metadata[KEY_DEADLINE] = str(int(assignment.deadline.timestamp()))
    return metadata


def labels_of(metadata: Mapping[str, str]) -> dict[str, str]:
    """The environment's `dynrunner.io/*` labels back from a sandbox's metadata."""
    own = (KEY_STAGE, KEY_DEADLINE)
    return {
        contract.LABEL_PREFIX + key.removeprefix(METADATA_PREFIX): value
        for key, value in metadata.items()
        if key.startswith(METADATA_PREFIX) and key not in own
    }


def is_job_sandbox(metadata: Mapping[str, str], pool: str) -> bool:
    """Whether a listed sandbox is a job of `pool` (has the labels an Environment needs)."""
    labels = labels_of(metadata)
    return labels.get(contract.LABEL_POOL) == pool and not malformed(metadata)


def malformed(metadata: Mapping[str, str]) -> str:
    """Why a sandbox's metadata cannot be one of our jobs' ("" if it can): anyone who may
    patch metadata could write `²` (a digit to `str.isdigit`, not to `int`) or a number no
    date holds, and one such sandbox must not stop the pool's listing."""
    labels = labels_of(metadata)
    if not labels.get(contract.LABEL_ASSIGNMENT_ID):
        return "no assignment id"
    if _number(labels.get(contract.LABEL_TASK_ID, "")) is None:
        return f"task id {labels.get(contract.LABEL_TASK_ID, '')[:20]!r} is not a number"
    seq = labels.get(contract.LABEL_STREAM_SEQ)
    if seq is not None and _number(seq) is None:
        return f"stream sequence {seq[:20]!r} is not a number"
    if KEY_DEADLINE in metadata and _deadline(metadata[KEY_DEADLINE]) is None:
        return f"deadline {metadata[KEY_DEADLINE][:20]!r} is not a time"
    return ""


def _number(value: str) -> int | None:
    """A non-negative integer written in ASCII digits, small enough for anything we count."""
    return int(value) if value.isascii() and value.isdigit() and len(value) <= MAX_DIGITS else None


def stage_of(metadata: Mapping[str, str]) -> str:
    stage = metadata.get(KEY_STAGE, STAGE_CREATED)
    return stage if stage in STAGES else STAGE_CREATED


def deadline_of(metadata: Mapping[str, str]) -> datetime | None:
    return _deadline(metadata.get(KEY_DEADLINE, ""))


def _deadline(value: str) -> datetime | None:
    seconds = _number(value)
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


# -- expiry ---------------------------------------------------------------------------------------


def expires_at(deadline: datetime | None, backend: OpenSandboxBackendConfig, now: datetime) -> datetime:
    """When the sandbox should expire if nobody renews it: one lease from now, never past the
    job's deadline plus the grace (`timeoutSeconds`), and at least the server's minimum away."""
    until = now + timedelta(seconds=backend.lease_s)
    if deadline is not None:
        until = min(until, deadline + timedelta(seconds=backend.timeout_s))
    return max(until, now + timedelta(seconds=MIN_TIMEOUT_S))


def renewal_due(expiry: datetime | None, backend: OpenSandboxBackendConfig, now: datetime) -> bool:
    """Renewed once half a lease has passed (and never when the deadline caps it anyway)."""
    if expiry is None:
        return False
    return expiry - now < timedelta(seconds=backend.lease_s / 2)


# -- the sandbox ----------------------------------------------------------------------------------


def sandbox_env(backend: OpenSandboxBackendConfig) -> dict[str, str]:
    """The entrypoint's environment (vm/README.md): where the agent serves the Workload API,
    and how long to wait for the delivery (a VM nobody delivers to expires within a lease)."""
    return {
        **backend.env,
        "SPIFFE_AGENT_SOCKET": backend.workload_api_socket,
        "DYNRUNNER_DELIVERY_TIMEOUT_SECONDS": str(max(backend.lease_s, backend.start_timeout_s)),
    }


def sandbox_request(
    assignment: Assignment, settings: VmSettings, *, now: datetime, stream_seq: int | None = None
) -> SandboxRequest:
    backend = settings.backend
    timeout = expires_at(assignment.deadline, backend, now) - now
    common = {
        "metadata": sandbox_metadata(assignment, stream_seq),
        "timeout_s": max(MIN_TIMEOUT_S, int(timeout.total_seconds())),
        "network_policy": backend.network_policy,
        "extensions": dict(backend.extensions),
    }
    if backend.template_id:
        return SandboxRequest(template_id=backend.template_id, **common)  # type: ignore[arg-type]
    return SandboxRequest(
        image=backend.image,
        entrypoint=tuple(backend.entrypoint),
        env=sandbox_env(backend),
        resources=dict(backend.resources),
        resource_requests=dict(backend.resource_requests),
        secure_access=backend.secure_access,
        **common,  # type: ignore[arg-type]
    )


def delivery_files(
    assignment_pb: bytes, *, join_token: str = "", bundle_pem: bytes = b"", env: Mapping[str, str] | None = None
) -> dict[str, bytes]:
    """The files of one delivery (under PARTIAL_DIR, then renamed to DELIVERY_DIR); `env` is
    for the executor only (the entrypoint exports it, then deletes the file)."""
    files = {ASSIGNMENT_FILE: assignment_pb}
    lines = [f"{name}={value}\n" for name, value in (env or {}).items() if "\n" not in value and "\r" not in value]
    if lines:
        files[ENV_FILE] = "".join(lines).encode()
    if join_token:
        files[TOKEN_FILE] = join_token.encode()
        if bundle_pem:
            files[BUNDLE_FILE] = bundle_pem
    return files


def agent_alias(trust_domain: str, pool: str, assignment_id: str) -> str:
    """The SPIFFE ID a job's VM agent gets besides its join-token ID (CreateJoinToken's
    `agent_id`), known before the VM boots: the job's entry is parented on it."""
    return f"spiffe://{trust_domain}{AGENT_ALIAS_PATH}/{pool}/{assignment_id}"
