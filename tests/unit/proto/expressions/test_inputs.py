"""The `inputs` context of a dispatched run, shared by the executor and the controller."""

from __future__ import annotations

from dynrunner.proto.expressions.inputs import inputs_context


def test_inputs_are_typed_by_the_dispatch_declaration() -> None:
    github = {
        "event_name": "workflow_dispatch",
        "event": {"inputs": {"debug": "true", "count": "3", "ratio": "0.5", "name": "x"}},
    }
    on = {
        "workflow_dispatch": {
            "inputs": {
                "debug": {"type": "boolean"},
                "count": {"type": "number"},
                "ratio": {"type": "number"},
                "name": {"type": "string"},
                "level": {"type": "choice", "default": "info"},
                "dry": {"type": "boolean", "default": False},
            }
        }
    }
    assert inputs_context(on, github) == {
        "debug": True,
        "count": 3,
        "ratio": 0.5,
        "name": "x",
        "level": "info",
        "dry": False,
    }
    assert inputs_context(on, {"event_name": "push", "event": {"inputs": {"a": "b"}}}) == {}
