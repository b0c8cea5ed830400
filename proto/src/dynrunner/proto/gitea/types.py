"""Small typed values for the RunnerService; protobuf stays at this edge.

`to_proto`/`from_proto` are the only places that touch generated messages, so the
controller and executor work with plain dataclasses and Python datetimes.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2
from google.protobuf.message import DecodeError

from dynrunner.proto._gen.runner.v1 import messages_pb2 as pb


class Result(enum.IntEnum):
    UNSPECIFIED = 0
    SUCCESS = 1
    FAILURE = 2
    CANCELLED = 3
    SKIPPED = 4

    @property
    def word(self) -> str:
        """The GitHub spelling (`success`, `failure`, `cancelled`, `skipped`), '' if unset."""
        return "" if self is Result.UNSPECIFIED else self.name.lower()

    @classmethod
    def from_word(cls, word: str) -> Result:
        return cls[word.upper()] if word else cls.UNSPECIFIED

    @classmethod
    def from_wire(cls, value: int) -> Result:
        """The wire value; one this enum does not know (`TaskNeed.result` is a Gitea status
        cast to Result, and a newer server may add values) reads as UNSPECIFIED instead of
        failing a call whose task is already claimed."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNSPECIFIED


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ts_to_proto(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    """Same value as `Timestamp.FromDatetime(value.astimezone(UTC))`, about 4x faster: every
    log row carries one, so this is on the executor's hot path."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.astimezone(UTC)
    delta = value - _EPOCH
    return timestamp_pb2.Timestamp(seconds=delta.days * 86400 + delta.seconds, nanos=delta.microseconds * 1000)


def ts_from_proto(msg: Any, name: str) -> datetime | None:
    """The timestamp field `name` of `msg` as an aware datetime, None when absent."""
    if not msg.HasField(name):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(msg, name)
    return stamp.ToDatetime(tzinfo=UTC)


def _wire_result(result: Result) -> Any:
    """The enum as the generated stubs type it (their .pyi admits only names or the enum wrapper)."""
    return int(result)


def plain_json(value: Any) -> Any:
    """A Struct's JSON with integral numbers as ints: Struct only knows doubles, but the
    webhook payload in the github context had integers (PR numbers, ids)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: plain_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_json(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class RunnerInfo:
    """A runner as Register/Declare return it. `token` is only ever set by Register."""

    id: int
    uuid: str
    token: str
    name: str
    version: str = ""
    labels: tuple[str, ...] = ()
    ephemeral: bool = False

    @classmethod
    def from_proto(cls, runner: pb.Runner) -> RunnerInfo:
        return cls(
            id=runner.id,
            uuid=runner.uuid,
            token=runner.token,
            name=runner.name,
            version=runner.version,
            labels=tuple(runner.labels),
            ephemeral=runner.ephemeral,
        )


@dataclass(frozen=True, slots=True)
class Need:
    outputs: Mapping[str, str]
    result: Result


class _WireContext:
    """`Task.context`, kept as the wire `Struct` until it is first read.

    Turning a Struct into Python values (and back) is the costliest part of handling a task
    in Python, and the controller only passes the context through: it reads two keys
    (`Task.context_get`) and moves it from FetchTask into the Assignment and on to the
    executor. The first read of `context` decodes it once; writes store what is given.
    """

    def __get__(self, task: Task | None, owner: type | None = None) -> Mapping[str, Any] | None:
        if task is None:
            return None  # the dataclass default
        value = task.__dict__["_context"]
        if isinstance(value, struct_pb2.Struct):
            value = plain_json(json_format.MessageToDict(value))
            task.__dict__["_context"] = value
        return value

    def __set__(self, task: Task, value: Mapping[str, Any] | struct_pb2.Struct | None) -> None:
        task.__dict__["_context"] = value


@dataclass(frozen=True)
class Task:
    """A claimed task. `context` is the `github` context as plain JSON values."""

    id: int
    workflow_payload: bytes | None = None
    context: Mapping[str, Any] | None = _WireContext()  # type: ignore[assignment]
    secrets: Mapping[str, str] = field(default_factory=dict)
    needs: Mapping[str, Need] = field(default_factory=dict)
    vars: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_proto(cls, task: pb.Task) -> Task:
        """The task; its context stays the wire Struct (read-only) until `context` is read."""
        return cls(
            id=task.id,
            workflow_payload=task.workflow_payload if task.HasField("workflow_payload") else None,
            context=task.context if task.HasField("context") else None,
            secrets=dict(task.secrets),
            needs={k: Need(outputs=dict(v.outputs), result=Result.from_wire(v.result)) for k, v in task.needs.items()},
            vars=dict(task.vars),
        )

    def to_proto(self) -> pb.Task:
        msg = pb.Task(id=self.id, secrets=dict(self.secrets), vars=dict(self.vars))
        if self.workflow_payload is not None:
            msg.workflow_payload = self.workflow_payload
        wire = self._wire_context()
        if wire is not None:
            msg.context.CopyFrom(wire)
        elif self.context is not None:
            msg.context.update(dict(self.context))
        for key, need in self.needs.items():
            msg.needs[key].CopyFrom(pb.TaskNeed(outputs=dict(need.outputs), result=pb.Result.ValueType(need.result)))
        return msg

    def context_get(self, key: str, default: Any = None) -> Any:
        """One top-level value of `context` (as `context.get` would give it), without decoding the rest."""
        wire = self._wire_context()
        if wire is None:
            return (self.context or {}).get(key, default)
        if key not in wire.fields:
            return default
        return plain_json(json_format.MessageToDict(wire.fields[key]))

    def with_context(self, *, drop: Iterable[str] = (), add: Mapping[str, str] | None = None) -> Task:
        """A copy whose context lacks the keys in `drop` and has the string values in `add`,
        in whichever form the context is held (no decoding). A task without a context keeps none."""
        wire = self._wire_context()
        if wire is not None:
            changed = struct_pb2.Struct()
            changed.CopyFrom(wire)
            for key in drop:
                if key in changed.fields:
                    del changed.fields[key]
            for key, value in (add or {}).items():
                changed.fields[key].string_value = value
            context: Mapping[str, Any] | struct_pb2.Struct | None = changed
        elif self.context is not None:
            context = {k: v for k, v in self.context.items() if k not in set(drop)} | dict(add or {})
        else:
            context = None
        return dataclasses.replace(self, context=context)

    def replace(self, **changes: Any) -> Task:
        """`dataclasses.replace` that leaves a context still in wire form undecoded."""
        changes.setdefault("context", self.__dict__["_context"])
        return dataclasses.replace(self, **changes)

    def _wire_context(self) -> struct_pb2.Struct | None:
        value = self.__dict__["_context"]
        return value if isinstance(value, struct_pb2.Struct) else None


@dataclass(slots=True)
class StepState:
    id: int
    result: Result = Result.UNSPECIFIED
    started_at: datetime | None = None
    stopped_at: datetime | None = None
    log_index: int = 0
    log_length: int = 0

    def to_proto(self) -> pb.StepState:
        message = pb.StepState()
        message.CopyFrom(self._message())
        return message

    def _message(self) -> pb.StepState:
        """The wire form, shared: never to be changed by the caller."""
        return _step_message(self.id, self.result, self.started_at, self.stopped_at, self.log_index, self.log_length)

    @classmethod
    def from_proto(cls, step: pb.StepState) -> StepState:
        return cls(
            id=step.id,
            result=Result.from_wire(step.result),
            started_at=ts_from_proto(step, "started_at"),
            stopped_at=ts_from_proto(step, "stopped_at"),
            log_index=step.log_index,
            log_length=step.log_length,
        )


@dataclass(slots=True)
class TaskState:
    id: int
    result: Result = Result.UNSPECIFIED
    started_at: datetime | None = None
    stopped_at: datetime | None = None
    steps: list[StepState] = field(default_factory=list)

    def to_proto(self) -> pb.TaskState:
        return pb.TaskState(
            id=self.id,
            result=_wire_result(self.result),
            started_at=ts_to_proto(self.started_at),
            stopped_at=ts_to_proto(self.stopped_at),
            steps=[s._message() for s in self.steps],
        )

    @classmethod
    def from_proto(cls, state: pb.TaskState) -> TaskState:
        return cls(
            id=state.id,
            result=Result.from_wire(state.result),
            started_at=ts_from_proto(state, "started_at"),
            stopped_at=ts_from_proto(state, "stopped_at"),
            steps=[StepState.from_proto(s) for s in state.steps],
        )

    def encode(self) -> bytes:
        """The wire form, for keeping a state outside a request (the executor's accepted state)."""
        return self.to_proto().SerializeToString()

    @classmethod
    def decode(cls, data: bytes) -> TaskState:
        """The inverse of `encode`; ValueError when `data` is not a TaskState message."""
        try:
            return cls.from_proto(pb.TaskState.FromString(data))
        except DecodeError as err:
            raise ValueError(f"not a TaskState message: {err}") from err


@functools.lru_cache(maxsize=1 << 16)
def _step_message(
    id: int, result: Result, started_at: datetime | None, stopped_at: datetime | None, log_index: int, log_length: int
) -> pb.StepState:
    """A step state's message, built once per distinct state. Gitea needs every step that
    started in every UpdateTask (`UpdateTaskByState`), so a job of thousands of steps sends
    the same finished ones over and over; building each message once, not per report, made
    a 20,000-step job's reports ~20x cheaper for the executor. More entries than a job has
    steps: the running step's states come and go, the finished ones stay."""
    return pb.StepState(
        id=id,
        result=_wire_result(result),
        started_at=ts_to_proto(started_at),
        stopped_at=ts_to_proto(stopped_at),
        log_index=log_index,
        log_length=log_length,
    )


@dataclass(frozen=True, slots=True)
class LogRow:
    time: datetime
    content: str

    def to_proto(self) -> pb.LogRow:
        return pb.LogRow(time=ts_to_proto(self.time), content=self.content)


@dataclass(frozen=True, slots=True)
class FetchResult:
    """`task` is None when there was nothing to claim; `tasks_version` is the server's."""

    task: Task | None
    tasks_version: int


@dataclass(frozen=True, slots=True)
class UpdateTaskResult:
    """The server's view after UpdateTask: a set `result` means the task is over
    (RESULT_CANCELLED when a user cancelled it)."""

    result: Result
    sent_outputs: frozenset[str]
