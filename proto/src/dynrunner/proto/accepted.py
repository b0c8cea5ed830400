"""The task state Gitea last accepted, in the short text form a backend can carry back (a
Pod's termination message: at most 4096 bytes, read by the kubelet when the container exits).

The executor writes it, the controller reads it to finalize a task whose executor died
(`reporting.finalize.final_steps`). It carries only what that final UpdateTask needs: the
task's result (set once the executor finalized) and, per step, its result or whether it had
started. Times and log ranges are left out: Gitea already holds those of every step it
accepted, and a step field the final UpdateTask leaves zero keeps what Gitea stored. The start
time of a step that started and did not finish is kept (in seconds, as Gitea stores it), so
the step sent as cancelled keeps its start.

    {"result": "", "steps": "sfr-", "started": {"2": 1764669600}}

One letter per step, by index: `s` success, `f` failure, `c` cancelled, `k` skipped, `r`
started and not finished, `-` not started. Other keys of the object (the executor's summary,
`identityWaitSeconds`) are left to their readers.

A job with more steps than fit (some 4,000) keeps its first steps and says how many there were
(`count`); the steps left out read as cancelled, as when no state can be had at all, so no
step that may have run is shown as skipped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dynrunner.proto.gitea import Result, StepState, TaskState

MESSAGE_LIMIT = 4096
"""The kubelet's limit on a container's termination message (bytes)."""
SUMMARY_ROOM = 128
"""Left free by `encode` for keys a writer adds later (the executor's summary)."""

_LETTERS = {Result.SUCCESS: "s", Result.FAILURE: "f", Result.CANCELLED: "c", Result.SKIPPED: "k"}
_RESULTS = {letter: result for result, letter in _LETTERS.items()}
STARTED, WAITING = "r", "-"


def encode(state: TaskState, limit: int = MESSAGE_LIMIT - SUMMARY_ROOM) -> dict[str, Any]:
    """`state` as the JSON object above, whose compact dump is at most `limit` bytes."""
    known = {step.id: step for step in state.steps if step.id >= 0}
    count = max(known, default=-1) + 1
    letters, started = [], {}
    for index in range(count):
        step = known.get(index)
        if step is not None and step.result in _LETTERS:
            letters.append(_LETTERS[step.result])
        elif step is not None and step.started_at is not None:
            letters.append(STARTED)
            started[str(index)] = int(step.started_at.timestamp())
        else:
            letters.append(WAITING)
    doc: dict[str, Any] = {"result": state.result.word, "steps": "".join(letters), "started": started}
    kept = count
    while len(dumps(doc)) > limit and kept > 0:
        kept = max(0, kept - (len(dumps(doc)) - limit))
        doc["steps"] = doc["steps"][:kept]
        doc["started"] = {key: value for key, value in started.items() if int(key) < kept}
        doc["count"] = count
    return doc


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


def decode(text: str) -> TaskState | None:
    """The state in `text` (None when it holds none: empty, a log's tail, a summary alone, or
    cut short by a writer that was killed). The task id is not carried: 0."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), str):
        return None
    started = doc.get("started") or {}
    try:
        result = Result.from_word(str(doc.get("result") or ""))
        steps = [_step(index, letter, started) for index, letter in enumerate(doc["steps"])]
        count = int(doc.get("count") or 0)
    except (KeyError, ValueError, TypeError, OverflowError, OSError):
        return None
    steps += [StepState(index, Result.CANCELLED) for index in range(len(steps), count)]
    return TaskState(id=0, result=result, steps=steps)


def _step(index: int, letter: str, started: Mapping[str, Any]) -> StepState:
    if letter in _RESULTS:
        return StepState(index, _RESULTS[letter])
    if letter == STARTED:
        return StepState(index, started_at=datetime.fromtimestamp(int(started[str(index)]), UTC))
    if letter == WAITING:
        return StepState(index)
    raise ValueError(f"unknown step letter {letter!r}")
