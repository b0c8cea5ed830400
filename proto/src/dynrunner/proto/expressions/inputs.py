"""The `inputs` context of a `workflow_dispatch` run, as the executor and the controller (for a
Pod's `container:` and `services:` values) both build it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def inputs_context(on: Any, github: Mapping[str, Any]) -> dict[str, Any]:
    """`inputs` for a `workflow_dispatch` run: the event's inputs (strings, as Gitea sends
    them) converted to the declared `boolean`/`number` types, declared defaults filling
    gaps. Other events have no inputs."""
    if github.get("event_name") != "workflow_dispatch":
        return {}
    event = github.get("event") or {}
    given = dict(event.get("inputs") or {}) if isinstance(event, Mapping) else {}
    declared: Mapping[str, Any] = {}
    if isinstance(on, Mapping):
        dispatch = on.get("workflow_dispatch")
        if isinstance(dispatch, Mapping) and isinstance(dispatch.get("inputs"), Mapping):
            declared = dispatch["inputs"]
    out: dict[str, Any] = dict(given)
    for name, declaration in declared.items():
        spec = declaration if isinstance(declaration, Mapping) else {}
        value = given.get(name, spec.get("default"))
        kind = spec.get("type")
        if kind == "boolean":
            out[name] = value if isinstance(value, bool) else str(value).strip().lower() == "true"
        elif kind == "number" and value not in (None, ""):
            try:
                number = float(value)
                out[name] = int(number) if number.is_integer() else number
            except (TypeError, ValueError):
                out[name] = value
        elif isinstance(value, (dict, list)):
            out[name] = json.dumps(value)
        elif value is not None:
            out[name] = value
    return out
