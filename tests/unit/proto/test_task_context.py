"""A task's `github` context stays in wire form until it is read: the controller moves it from
FetchTask into the Assignment and on to the executor without turning it into Python values."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2

from dynrunner.proto import assignment as A
from dynrunner.proto._gen.runner.v1 import messages_pb2 as pb
from dynrunner.proto.gitea import Task
from dynrunner.proto.gitea import types as gitea_types

CONTEXT: dict[str, Any] = {
    "job": "build",
    "repository": "Owner/Repo",
    "token": "task-token",
    "gitea_runtime_token": "jwt.runtime",
    "event": {"number": 7, "pull_request": {"draft": False}, "labels": ["a", "b"]},
    "run_id": "12",
}


def wire_task() -> pb.Task:
    msg = pb.Task(id=5, workflow_payload=b"jobs: {}", secrets={"S": "v"}, vars={"V": "1"})
    msg.context.update(CONTEXT)
    return msg


@pytest.fixture
def struct_decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every whole-Struct decode, by the keys it held."""
    decoded: list[str] = []
    original = json_format.MessageToDict

    def counting(message: Any, **kwargs: Any) -> Any:
        if isinstance(message, struct_pb2.Struct):
            decoded.append(",".join(sorted(message.fields)))
        return original(message, **kwargs)

    monkeypatch.setattr(gitea_types.json_format, "MessageToDict", counting)
    return decoded


def test_the_context_reads_as_plain_json_values() -> None:
    task = Task.from_proto(wire_task())
    assert task.context == CONTEXT  # integral numbers come back as ints
    assert isinstance(task.context["event"]["number"], int)
    assert task == Task(id=5, workflow_payload=b"jobs: {}", context=CONTEXT, secrets={"S": "v"}, vars={"V": "1"})


def test_single_keys_are_read_without_decoding_the_rest(struct_decodes: list[str]) -> None:
    task = Task.from_proto(wire_task())
    assert task.context_get("job") == "build"
    assert task.context_get("event") == CONTEXT["event"]
    assert task.context_get("missing", "x") == "x"
    assert struct_decodes == []  # only the values asked for were decoded, never the whole context
    assert Task(id=1, context={"job": "j"}).context_get("job") == "j"
    assert Task(id=1).context_get("job") is None


def test_secrets_are_split_off_and_put_back_in_wire_form(struct_decodes: list[str]) -> None:
    a = A.Assignment(
        assignment_id="a1",
        pool="p",
        backend="local",
        claimed_at=datetime(2026, 1, 1, tzinfo=UTC),
        task=Task.from_proto(wire_task()),
        runner=A.ClaimingRunner(id=1, uuid="u", token="runner-token"),
        gitea_url="http://g",
        job_key="build",
    )
    public, parts = A.split_secrets(a)
    blob = A.encode(public)
    for secret in (b"task-token", b"jwt.runtime", b"runner-token"):
        assert secret not in blob
    restored = A.merge_secrets(A.decode(blob), parts)
    handed = A.encode(restored)
    assert struct_decodes == []  # nothing on the controller's path decoded the context
    assert A.decode(handed).task.context == CONTEXT
    assert A.decode(handed).task.secrets == {"S": "v"}


@pytest.mark.parametrize("form", ["wire", "decoded"])
def test_with_context_and_replace_agree_for_both_forms(form: str) -> None:
    task = Task.from_proto(wire_task())
    if form == "decoded":
        task = Task(id=5, workflow_payload=b"jobs: {}", context=dict(CONTEXT), secrets={"S": "v"}, vars={"V": "1"})
    changed = task.with_context(drop=("token", "absent"), add={"new": "value"})
    expected = {k: v for k, v in CONTEXT.items() if k != "token"} | {"new": "value"}
    assert changed.context == expected
    assert task.context == CONTEXT  # the original is untouched
    assert task.replace(secrets={}).context == CONTEXT
    assert dataclasses.replace(task, vars={}).context == CONTEXT
    assert Task(id=1).with_context(add={"token": "t"}).context is None  # no context stays none
