"""The compiled runner.v1 / ping.v1 descriptors, field by field, against the wire contract.

The table is the contract as Gitea's actions-proto descriptors define it (see
shared/reference/gitea-runner-protocol.md §1.3): message, field, number, type, JSON name,
flags. A renumbered, retyped or renamed field fails here before it fails against Gitea.
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor

from dynrunner.proto._gen.ping.v1 import messages_pb2 as ping_pb
from dynrunner.proto._gen.ping.v1 import services_pb2 as ping_svc
from dynrunner.proto._gen.runner.v1 import messages_pb2 as runner_pb
from dynrunner.proto._gen.runner.v1 import services_pb2 as runner_svc

CONTRACT = [
    ("runner.v1.RegisterRequest", "name", 1, "string", "name", ""),
    ("runner.v1.RegisterRequest", "token", 2, "string", "token", ""),
    ("runner.v1.RegisterRequest", "agent_labels", 3, "string", "agentLabels", "repeated deprecated"),
    ("runner.v1.RegisterRequest", "custom_labels", 4, "string", "customLabels", "repeated deprecated"),
    ("runner.v1.RegisterRequest", "version", 5, "string", "version", ""),
    ("runner.v1.RegisterRequest", "labels", 6, "string", "labels", "repeated"),
    ("runner.v1.RegisterRequest", "ephemeral", 7, "bool", "ephemeral", ""),
    ("runner.v1.RegisterRequest", "capabilities", 8, "string", "capabilities", "repeated"),
    ("runner.v1.RegisterResponse", "runner", 1, "runner.v1.Runner", "runner", ""),
    ("runner.v1.DeclareRequest", "version", 1, "string", "version", ""),
    ("runner.v1.DeclareRequest", "labels", 2, "string", "labels", "repeated"),
    ("runner.v1.DeclareRequest", "capabilities", 3, "string", "capabilities", "repeated"),
    ("runner.v1.DeclareResponse", "runner", 1, "runner.v1.Runner", "runner", ""),
    ("runner.v1.FetchTaskRequest", "tasks_version", 1, "int64", "tasksVersion", ""),
    ("runner.v1.FetchTaskResponse", "task", 1, "runner.v1.Task", "task", ""),
    ("runner.v1.FetchTaskResponse", "tasks_version", 2, "int64", "tasksVersion", ""),
    ("runner.v1.UpdateTaskRequest", "state", 1, "runner.v1.TaskState", "state", ""),
    ("runner.v1.UpdateTaskRequest", "outputs", 2, "runner.v1.UpdateTaskRequest.OutputsEntry", "outputs", "repeated"),
    ("runner.v1.UpdateTaskRequest.OutputsEntry", "key", 1, "string", "key", ""),
    ("runner.v1.UpdateTaskRequest.OutputsEntry", "value", 2, "string", "value", ""),
    ("runner.v1.UpdateTaskResponse", "state", 1, "runner.v1.TaskState", "state", ""),
    ("runner.v1.UpdateTaskResponse", "sent_outputs", 2, "string", "sentOutputs", "repeated"),
    ("runner.v1.UpdateLogRequest", "task_id", 1, "int64", "taskId", ""),
    ("runner.v1.UpdateLogRequest", "index", 2, "int64", "index", ""),
    ("runner.v1.UpdateLogRequest", "rows", 3, "runner.v1.LogRow", "rows", "repeated"),
    ("runner.v1.UpdateLogRequest", "no_more", 4, "bool", "noMore", ""),
    ("runner.v1.UpdateLogResponse", "ack_index", 1, "int64", "ackIndex", ""),
    ("runner.v1.Runner", "id", 1, "int64", "id", ""),
    ("runner.v1.Runner", "uuid", 2, "string", "uuid", ""),
    ("runner.v1.Runner", "token", 3, "string", "token", ""),
    ("runner.v1.Runner", "name", 4, "string", "name", ""),
    ("runner.v1.Runner", "status", 5, "runner.v1.RunnerStatus", "status", ""),
    ("runner.v1.Runner", "agent_labels", 6, "string", "agentLabels", "repeated deprecated"),
    ("runner.v1.Runner", "custom_labels", 7, "string", "customLabels", "repeated deprecated"),
    ("runner.v1.Runner", "version", 8, "string", "version", ""),
    ("runner.v1.Runner", "labels", 9, "string", "labels", "repeated"),
    ("runner.v1.Runner", "ephemeral", 10, "bool", "ephemeral", ""),
    ("runner.v1.Task", "id", 1, "int64", "id", ""),
    ("runner.v1.Task", "workflow_payload", 2, "bytes", "workflowPayload", "optional"),
    ("runner.v1.Task", "context", 3, "google.protobuf.Struct", "context", "optional"),
    ("runner.v1.Task", "secrets", 4, "runner.v1.Task.SecretsEntry", "secrets", "repeated"),
    ("runner.v1.Task", "machine", 5, "string", "machine", "deprecated"),
    ("runner.v1.Task", "needs", 6, "runner.v1.Task.NeedsEntry", "needs", "repeated"),
    ("runner.v1.Task", "vars", 7, "runner.v1.Task.VarsEntry", "vars", "repeated"),
    ("runner.v1.Task.SecretsEntry", "key", 1, "string", "key", ""),
    ("runner.v1.Task.SecretsEntry", "value", 2, "string", "value", ""),
    ("runner.v1.Task.NeedsEntry", "key", 1, "string", "key", ""),
    ("runner.v1.Task.NeedsEntry", "value", 2, "runner.v1.TaskNeed", "value", ""),
    ("runner.v1.Task.VarsEntry", "key", 1, "string", "key", ""),
    ("runner.v1.Task.VarsEntry", "value", 2, "string", "value", ""),
    ("runner.v1.TaskNeed", "outputs", 1, "runner.v1.TaskNeed.OutputsEntry", "outputs", "repeated"),
    ("runner.v1.TaskNeed", "result", 2, "runner.v1.Result", "result", ""),
    ("runner.v1.TaskNeed.OutputsEntry", "key", 1, "string", "key", ""),
    ("runner.v1.TaskNeed.OutputsEntry", "value", 2, "string", "value", ""),
    ("runner.v1.TaskState", "id", 1, "int64", "id", ""),
    ("runner.v1.TaskState", "result", 2, "runner.v1.Result", "result", ""),
    ("runner.v1.TaskState", "started_at", 3, "google.protobuf.Timestamp", "startedAt", ""),
    ("runner.v1.TaskState", "stopped_at", 4, "google.protobuf.Timestamp", "stoppedAt", ""),
    ("runner.v1.TaskState", "steps", 5, "runner.v1.StepState", "steps", "repeated"),
    ("runner.v1.StepState", "id", 1, "int64", "id", ""),
    ("runner.v1.StepState", "result", 2, "runner.v1.Result", "result", ""),
    ("runner.v1.StepState", "started_at", 3, "google.protobuf.Timestamp", "startedAt", ""),
    ("runner.v1.StepState", "stopped_at", 4, "google.protobuf.Timestamp", "stoppedAt", ""),
    ("runner.v1.StepState", "log_index", 5, "int64", "logIndex", ""),
    ("runner.v1.StepState", "log_length", 6, "int64", "logLength", ""),
    ("runner.v1.LogRow", "time", 1, "google.protobuf.Timestamp", "time", ""),
    ("runner.v1.LogRow", "content", 2, "string", "content", ""),
    ("ping.v1.PingRequest", "data", 1, "string", "data", ""),
    ("ping.v1.PingResponse", "data", 1, "string", "data", ""),
]

ENUMS = {
    "runner.v1.RunnerStatus": [
        ("RUNNER_STATUS_UNSPECIFIED", 0),
        ("RUNNER_STATUS_IDLE", 1),
        ("RUNNER_STATUS_ACTIVE", 2),
        ("RUNNER_STATUS_OFFLINE", 3),
    ],
    "runner.v1.Result": [
        ("RESULT_UNSPECIFIED", 0),
        ("RESULT_SUCCESS", 1),
        ("RESULT_FAILURE", 2),
        ("RESULT_CANCELLED", 3),
        ("RESULT_SKIPPED", 4),
    ],
}

SERVICES = {
    "runner.v1.RunnerService": [
        ("Register", "runner.v1.RegisterRequest", "runner.v1.RegisterResponse"),
        ("Declare", "runner.v1.DeclareRequest", "runner.v1.DeclareResponse"),
        ("FetchTask", "runner.v1.FetchTaskRequest", "runner.v1.FetchTaskResponse"),
        ("UpdateTask", "runner.v1.UpdateTaskRequest", "runner.v1.UpdateTaskResponse"),
        ("UpdateLog", "runner.v1.UpdateLogRequest", "runner.v1.UpdateLogResponse"),
    ],
    "ping.v1.PingService": [("Ping", "ping.v1.PingRequest", "ping.v1.PingResponse")],
}

FILES = {
    "runner/v1/messages.proto": runner_pb.DESCRIPTOR,
    "runner/v1/services.proto": runner_svc.DESCRIPTOR,
    "ping/v1/messages.proto": ping_pb.DESCRIPTOR,
    "ping/v1/services.proto": ping_svc.DESCRIPTOR,
}

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT64: "int64",
}


def _messages() -> dict[str, object]:
    found: dict[str, object] = {}

    def walk(desc: object) -> None:
        found[desc.full_name] = desc  # type: ignore[attr-defined]
        for nested in desc.nested_types:  # type: ignore[attr-defined]
            walk(nested)

    for fd in (runner_pb.DESCRIPTOR, ping_pb.DESCRIPTOR):
        for desc in fd.message_types_by_name.values():
            walk(desc)
    return found


def _type_name(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        return field.message_type.full_name
    if field.enum_type is not None:
        return field.enum_type.full_name
    return _SCALARS[field.type]


def _flags(field: FieldDescriptor) -> str:
    flags = []
    if field.is_repeated:
        flags.append("repeated")
    if field.has_presence and field.containing_oneof is not None and field.containing_oneof.name.startswith("_"):
        flags.append("optional")
    if field.GetOptions().deprecated:
        flags.append("deprecated")
    return " ".join(flags)


@pytest.mark.parametrize(("message", "name", "number", "type_name", "json_name", "flags"), CONTRACT)
def test_field_matches_contract(message: str, name: str, number: int, type_name: str, json_name: str, flags: str):
    desc = _messages()[message]
    field = desc.fields_by_name[name]  # type: ignore[attr-defined]
    assert (field.number, _type_name(field), field.json_name, _flags(field)) == (number, type_name, json_name, flags)


def test_no_fields_beyond_contract():
    expected = {(m, f) for m, f, *_ in CONTRACT}
    actual = {(full, f.name) for full, d in _messages().items() for f in d.fields}  # type: ignore[attr-defined]
    assert actual == expected


@pytest.mark.parametrize(("enum", "values"), ENUMS.items())
def test_enum_matches_contract(enum: str, values: list[tuple[str, int]]):
    desc = runner_pb.DESCRIPTOR.enum_types_by_name[enum.rsplit(".", maxsplit=1)[-1]]
    assert [(v.name, v.number) for v in desc.values] == values


@pytest.mark.parametrize(("service", "methods"), SERVICES.items())
def test_service_matches_contract(service: str, methods: list[tuple[str, str, str]]):
    fd = runner_svc.DESCRIPTOR if service.startswith("runner") else ping_svc.DESCRIPTOR
    desc = fd.services_by_name[service.rsplit(".", maxsplit=1)[-1]]
    assert [(m.name, m.input_type.full_name, m.output_type.full_name) for m in desc.methods] == methods


@pytest.mark.parametrize(("filename", "fd"), FILES.items())
def test_file_names_and_packages(filename: str, fd: object):
    assert fd.name == filename  # type: ignore[attr-defined]
    assert fd.package == filename.split("/", maxsplit=1)[0] + ".v1"  # type: ignore[attr-defined]
    assert fd.GetOptions().go_package.startswith("gitea.dev/actions-proto-go/")  # type: ignore[attr-defined]


def test_map_entries_are_maps():
    msgs = _messages()
    for name in (
        "runner.v1.Task.SecretsEntry",
        "runner.v1.Task.NeedsEntry",
        "runner.v1.Task.VarsEntry",
        "runner.v1.TaskNeed.OutputsEntry",
        "runner.v1.UpdateTaskRequest.OutputsEntry",
    ):
        assert msgs[name].GetOptions().map_entry, name  # type: ignore[attr-defined]
