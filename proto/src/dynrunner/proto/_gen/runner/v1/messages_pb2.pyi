import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunnerStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUNNER_STATUS_UNSPECIFIED: _ClassVar[RunnerStatus]
    RUNNER_STATUS_IDLE: _ClassVar[RunnerStatus]
    RUNNER_STATUS_ACTIVE: _ClassVar[RunnerStatus]
    RUNNER_STATUS_OFFLINE: _ClassVar[RunnerStatus]

class Result(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_UNSPECIFIED: _ClassVar[Result]
    RESULT_SUCCESS: _ClassVar[Result]
    RESULT_FAILURE: _ClassVar[Result]
    RESULT_CANCELLED: _ClassVar[Result]
    RESULT_SKIPPED: _ClassVar[Result]
RUNNER_STATUS_UNSPECIFIED: RunnerStatus
RUNNER_STATUS_IDLE: RunnerStatus
RUNNER_STATUS_ACTIVE: RunnerStatus
RUNNER_STATUS_OFFLINE: RunnerStatus
RESULT_UNSPECIFIED: Result
RESULT_SUCCESS: Result
RESULT_FAILURE: Result
RESULT_CANCELLED: Result
RESULT_SKIPPED: Result

class RegisterRequest(_message.Message):
    __slots__ = ("name", "token", "agent_labels", "custom_labels", "version", "labels", "ephemeral", "capabilities")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    AGENT_LABELS_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_LABELS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    EPHEMERAL_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    token: str
    agent_labels: _containers.RepeatedScalarFieldContainer[str]
    custom_labels: _containers.RepeatedScalarFieldContainer[str]
    version: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    ephemeral: bool
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., token: _Optional[str] = ..., agent_labels: _Optional[_Iterable[str]] = ..., custom_labels: _Optional[_Iterable[str]] = ..., version: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., ephemeral: _Optional[bool] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("runner",)
    RUNNER_FIELD_NUMBER: _ClassVar[int]
    runner: Runner
    def __init__(self, runner: _Optional[_Union[Runner, _Mapping]] = ...) -> None: ...

class DeclareRequest(_message.Message):
    __slots__ = ("version", "labels", "capabilities")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    version: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class DeclareResponse(_message.Message):
    __slots__ = ("runner",)
    RUNNER_FIELD_NUMBER: _ClassVar[int]
    runner: Runner
    def __init__(self, runner: _Optional[_Union[Runner, _Mapping]] = ...) -> None: ...

class FetchTaskRequest(_message.Message):
    __slots__ = ("tasks_version",)
    TASKS_VERSION_FIELD_NUMBER: _ClassVar[int]
    tasks_version: int
    def __init__(self, tasks_version: _Optional[int] = ...) -> None: ...

class FetchTaskResponse(_message.Message):
    __slots__ = ("task", "tasks_version")
    TASK_FIELD_NUMBER: _ClassVar[int]
    TASKS_VERSION_FIELD_NUMBER: _ClassVar[int]
    task: Task
    tasks_version: int
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., tasks_version: _Optional[int] = ...) -> None: ...

class UpdateTaskRequest(_message.Message):
    __slots__ = ("state", "outputs")
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    state: TaskState
    outputs: _containers.ScalarMap[str, str]
    def __init__(self, state: _Optional[_Union[TaskState, _Mapping]] = ..., outputs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UpdateTaskResponse(_message.Message):
    __slots__ = ("state", "sent_outputs")
    STATE_FIELD_NUMBER: _ClassVar[int]
    SENT_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    state: TaskState
    sent_outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, state: _Optional[_Union[TaskState, _Mapping]] = ..., sent_outputs: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateLogRequest(_message.Message):
    __slots__ = ("task_id", "index", "rows", "no_more")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    NO_MORE_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    index: int
    rows: _containers.RepeatedCompositeFieldContainer[LogRow]
    no_more: bool
    def __init__(self, task_id: _Optional[int] = ..., index: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[LogRow, _Mapping]]] = ..., no_more: _Optional[bool] = ...) -> None: ...

class UpdateLogResponse(_message.Message):
    __slots__ = ("ack_index",)
    ACK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ack_index: int
    def __init__(self, ack_index: _Optional[int] = ...) -> None: ...

class Runner(_message.Message):
    __slots__ = ("id", "uuid", "token", "name", "status", "agent_labels", "custom_labels", "version", "labels", "ephemeral")
    ID_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_LABELS_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_LABELS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    EPHEMERAL_FIELD_NUMBER: _ClassVar[int]
    id: int
    uuid: str
    token: str
    name: str
    status: RunnerStatus
    agent_labels: _containers.RepeatedScalarFieldContainer[str]
    custom_labels: _containers.RepeatedScalarFieldContainer[str]
    version: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    ephemeral: bool
    def __init__(self, id: _Optional[int] = ..., uuid: _Optional[str] = ..., token: _Optional[str] = ..., name: _Optional[str] = ..., status: _Optional[_Union[RunnerStatus, str]] = ..., agent_labels: _Optional[_Iterable[str]] = ..., custom_labels: _Optional[_Iterable[str]] = ..., version: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., ephemeral: _Optional[bool] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "workflow_payload", "context", "secrets", "machine", "needs", "vars")
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class NeedsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TaskNeed
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TaskNeed, _Mapping]] = ...) -> None: ...
    class VarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    NEEDS_FIELD_NUMBER: _ClassVar[int]
    VARS_FIELD_NUMBER: _ClassVar[int]
    id: int
    workflow_payload: bytes
    context: _struct_pb2.Struct
    secrets: _containers.ScalarMap[str, str]
    machine: str
    needs: _containers.MessageMap[str, TaskNeed]
    vars: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[int] = ..., workflow_payload: _Optional[bytes] = ..., context: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., secrets: _Optional[_Mapping[str, str]] = ..., machine: _Optional[str] = ..., needs: _Optional[_Mapping[str, TaskNeed]] = ..., vars: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TaskNeed(_message.Message):
    __slots__ = ("outputs", "result")
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.ScalarMap[str, str]
    result: Result
    def __init__(self, outputs: _Optional[_Mapping[str, str]] = ..., result: _Optional[_Union[Result, str]] = ...) -> None: ...

class TaskState(_message.Message):
    __slots__ = ("id", "result", "started_at", "stopped_at", "steps")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    STOPPED_AT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    id: int
    result: Result
    started_at: _timestamp_pb2.Timestamp
    stopped_at: _timestamp_pb2.Timestamp
    steps: _containers.RepeatedCompositeFieldContainer[StepState]
    def __init__(self, id: _Optional[int] = ..., result: _Optional[_Union[Result, str]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., stopped_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[StepState, _Mapping]]] = ...) -> None: ...

class StepState(_message.Message):
    __slots__ = ("id", "result", "started_at", "stopped_at", "log_index", "log_length")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    STOPPED_AT_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LOG_LENGTH_FIELD_NUMBER: _ClassVar[int]
    id: int
    result: Result
    started_at: _timestamp_pb2.Timestamp
    stopped_at: _timestamp_pb2.Timestamp
    log_index: int
    log_length: int
    def __init__(self, id: _Optional[int] = ..., result: _Optional[_Union[Result, str]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., stopped_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., log_index: _Optional[int] = ..., log_length: _Optional[int] = ...) -> None: ...

class LogRow(_message.Message):
    __slots__ = ("time", "content")
    TIME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    content: str
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., content: _Optional[str] = ...) -> None: ...
