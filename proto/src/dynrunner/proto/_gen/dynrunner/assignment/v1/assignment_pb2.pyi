import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from dynrunner.proto._gen.runner.v1 import messages_pb2 as _messages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Assignment(_message.Message):
    __slots__ = ("version", "assignment_id", "pool", "backend", "claimed_at", "task", "runner", "gitea_url", "job_key", "spiffe_id", "deadline", "executor", "sealed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_AT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FIELD_NUMBER: _ClassVar[int]
    GITEA_URL_FIELD_NUMBER: _ClassVar[int]
    JOB_KEY_FIELD_NUMBER: _ClassVar[int]
    SPIFFE_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    version: int
    assignment_id: str
    pool: str
    backend: str
    claimed_at: _timestamp_pb2.Timestamp
    task: _messages_pb2.Task
    runner: ClaimingRunner
    gitea_url: str
    job_key: str
    spiffe_id: str
    deadline: _timestamp_pb2.Timestamp
    executor: ExecutorOptions
    sealed: Sealed
    def __init__(self, version: _Optional[int] = ..., assignment_id: _Optional[str] = ..., pool: _Optional[str] = ..., backend: _Optional[str] = ..., claimed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., task: _Optional[_Union[_messages_pb2.Task, _Mapping]] = ..., runner: _Optional[_Union[ClaimingRunner, _Mapping]] = ..., gitea_url: _Optional[str] = ..., job_key: _Optional[str] = ..., spiffe_id: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., executor: _Optional[_Union[ExecutorOptions, _Mapping]] = ..., sealed: _Optional[_Union[Sealed, _Mapping]] = ...) -> None: ...

class ClaimingRunner(_message.Message):
    __slots__ = ("id", "uuid", "token", "name", "labels")
    ID_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    id: int
    uuid: str
    token: str
    name: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[int] = ..., uuid: _Optional[str] = ..., token: _Optional[str] = ..., name: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ...) -> None: ...

class ExecutorOptions(_message.Message):
    __slots__ = ("workspace", "artifacts", "identity", "outputs_total_limit_bytes", "log_level", "cache")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_TOTAL_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOG_LEVEL_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    workspace: str
    artifacts: ArtifactStore
    identity: IdentityWait
    outputs_total_limit_bytes: int
    log_level: str
    cache: CacheService
    def __init__(self, workspace: _Optional[str] = ..., artifacts: _Optional[_Union[ArtifactStore, _Mapping]] = ..., identity: _Optional[_Union[IdentityWait, _Mapping]] = ..., outputs_total_limit_bytes: _Optional[int] = ..., log_level: _Optional[str] = ..., cache: _Optional[_Union[CacheService, _Mapping]] = ...) -> None: ...

class CacheService(_message.Message):
    __slots__ = ("url", "v2", "grant")
    URL_FIELD_NUMBER: _ClassVar[int]
    V2_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    url: str
    v2: bool
    grant: str
    def __init__(self, url: _Optional[str] = ..., v2: _Optional[bool] = ..., grant: _Optional[str] = ...) -> None: ...

class ArtifactStore(_message.Message):
    __slots__ = ("driver", "path", "bucket", "prefix", "endpoint", "region", "max_size_bytes")
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    driver: str
    path: str
    bucket: str
    prefix: str
    endpoint: str
    region: str
    max_size_bytes: int
    def __init__(self, driver: _Optional[str] = ..., path: _Optional[str] = ..., bucket: _Optional[str] = ..., prefix: _Optional[str] = ..., endpoint: _Optional[str] = ..., region: _Optional[str] = ..., max_size_bytes: _Optional[int] = ...) -> None: ...

class IdentityWait(_message.Message):
    __slots__ = ("enabled", "workload_api_socket", "timeout_seconds")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_API_SOCKET_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    workload_api_socket: str
    timeout_seconds: int
    def __init__(self, enabled: _Optional[bool] = ..., workload_api_socket: _Optional[str] = ..., timeout_seconds: _Optional[int] = ...) -> None: ...

class Sealed(_message.Message):
    __slots__ = ("key_id", "nonce", "ciphertext")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    nonce: bytes
    ciphertext: bytes
    def __init__(self, key_id: _Optional[str] = ..., nonce: _Optional[bytes] = ..., ciphertext: _Optional[bytes] = ...) -> None: ...

class SecretParts(_message.Message):
    __slots__ = ("task_secrets", "runner_token", "task_token", "runtime_token")
    class TaskSecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_SECRETS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TASK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    task_secrets: _containers.ScalarMap[str, str]
    runner_token: str
    task_token: str
    runtime_token: str
    def __init__(self, task_secrets: _Optional[_Mapping[str, str]] = ..., runner_token: _Optional[str] = ..., task_token: _Optional[str] = ..., runtime_token: _Optional[str] = ...) -> None: ...
