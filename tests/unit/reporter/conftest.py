"""An in-memory stand-in for Gitea's UpdateLog/UpdateTask handlers, for reporter unit tests.

It applies Gitea's arithmetic (G-0715 `routers/api/actions/runner/runner.go`): UpdateLog
appends ``rows[ack - index:]`` only when ``index <= ack < index + len(rows)``, archives on
``no_more`` (but, like servers before #37631, only when the request has rows), and rejects
new rows once archived; UpdateTask stores outputs first-write-wins and deletes the runner
on a final result. The integration tests run the same flows against the real double.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pytest

from dynrunner.proto.gitea import (
    AlreadyExists,
    GiteaError,
    LogRow,
    RequestTooLarge,
    Result,
    StepState,
    TaskState,
    Unauthenticated,
    UpdateTaskResult,
)


@dataclass
class Call:
    kind: str  # "log" or "task"
    index: int = 0
    rows: list[LogRow] = field(default_factory=list)
    no_more: bool = False
    state: TaskState | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    ack: int | None = None
    at: float = field(default_factory=time.monotonic)


class FakeGitea:
    def __init__(self, *, task_id: int = 7, preexisting: int = 0) -> None:
        self.task_id = task_id
        self.rows = [LogRow(time=_epoch(), content=f"stage {i}") for i in range(preexisting)]
        self.archived = False
        self.outputs: dict[str, str] = {}
        self.result = Result.UNSPECIFIED
        self.steps: dict[int, StepState] = {}
        self.runner_deleted = False
        self.calls: list[Call] = []
        self.failures: list[GiteaError] = []  # raised by the next calls, in order
        self.refusal: GiteaError | None = None  # raised by every call from now on
        self.lose_rows_after: int | None = None  # drop stored rows beyond this once
        self.delay_s = 0.0  # how long each UpdateLog takes
        self.cancel_as_error = False  # answer a cancelled call as connectrpc does: a "Canceled" error
        self.max_output_bytes: int | None = None  # a front end's body limit: larger outputs get HTTP 413
        self.completes_abandoned = False  # as Gitea: a call the client abandons still runs to its end
        self.in_flight = 0
        self.most_in_flight = 0  # UpdateLogs being handled at once

    async def update_log(
        self, task_id: int, index: int, rows: Sequence[LogRow], *, no_more: bool = False, retry: object = None
    ) -> int:
        call = Call("log", index=index, rows=list(rows), no_more=no_more)
        self.calls.append(call)
        if self.completes_abandoned:
            return await asyncio.shield(self._handle_log(call, task_id, index, rows, no_more))
        return await self._handle_log(call, task_id, index, rows, no_more)

    async def _handle_log(self, call: Call, task_id: int, index: int, rows: Sequence[LogRow], no_more: bool) -> int:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self._apply_log(call, task_id, index, rows, no_more)
        finally:
            self.in_flight -= 1

    async def _apply_log(self, call: Call, task_id: int, index: int, rows: Sequence[LogRow], no_more: bool) -> int:
        if self.delay_s:
            try:
                await asyncio.sleep(self.delay_s)
            except asyncio.CancelledError:
                if self.cancel_as_error:
                    raise GiteaError("Request was cancelled", code="Canceled") from None
                raise
        self._gate()
        assert task_id == self.task_id
        if self.lose_rows_after is not None:
            del self.rows[self.lose_rows_after :]
            self.lose_rows_after = None
        ack = len(self.rows)
        new = list(rows[ack - index :]) if index <= ack < index + len(rows) else []
        if self.archived:
            if new:
                raise AlreadyExists("log file has been archived")
            call.ack = ack
            return ack
        if not new:
            call.ack = ack
            return ack
        self.rows.extend(new)
        if no_more:
            self.archived = True
        call.ack = len(self.rows)
        return len(self.rows)

    async def update_task(
        self, state: TaskState, outputs: Mapping[str, str] | None = None, *, retry: object = None
    ) -> UpdateTaskResult:
        call = Call("task", state=replace(state, steps=[replace(s) for s in state.steps]), outputs=dict(outputs or {}))
        call.ack = len(self.rows)  # the rows Gitea holds as it takes the report
        self.calls.append(call)
        size = sum(len(k) + len(v) for k, v in (outputs or {}).items())
        if self.max_output_bytes is not None and size > self.max_output_bytes:
            raise RequestTooLarge("HTTP 413")
        self._gate()
        # Gitea's UpdateTaskByState: a step the request leaves out keeps its fields, and is
        # `running` again if it has a start time.
        reported = {step.id for step in state.steps}
        for step in list(self.steps.values()):
            if step.id not in reported and step.started_at is not None:
                self.steps[step.id] = replace(step, result=Result.UNSPECIFIED)
        for step in state.steps:
            self.steps[step.id] = replace(step)
        for key, value in (outputs or {}).items():
            self.outputs.setdefault(key, value)
        if self.result == Result.UNSPECIFIED and state.result != Result.UNSPECIFIED:
            self.result = state.result
            self.runner_deleted = True
        return UpdateTaskResult(result=self.result, sent_outputs=frozenset(self.outputs))

    def _gate(self) -> None:
        if self.runner_deleted:
            raise Unauthenticated("unregistered runner")
        if self.refusal is not None:
            raise self.refusal
        if self.failures:
            raise self.failures.pop(0)

    @property
    def contents(self) -> list[str]:
        return [row.content for row in self.rows]

    def log_calls(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "log"]

    def task_calls(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "task"]


def _epoch() -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def make_fake() -> type[FakeGitea]:
    return FakeGitea


@pytest.fixture
def fake() -> FakeGitea:
    return FakeGitea()
