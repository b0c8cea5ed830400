"""The reaper's round when Gitea is down or one environment misbehaves: the others are still
reaped, and a Gitea outage costs one finalize attempt per round, not one per environment."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from dynrunner.controller import contract
from dynrunner.controller.backends.base import Diagnosis, Environment, FailureReason, Observation, Phase
from dynrunner.controller.capacity import Capacity
from dynrunner.controller.metrics import Metrics
from dynrunner.controller.reaper import PoolWatch, Reaper
from dynrunner.proto.assignment import Assignment
from dynrunner.proto.gitea import Unavailable
from tests.integration.controller.infra.samples import make_assignment


class DownGitea:
    """A client whose every call has already outlasted its retries."""

    def __init__(self) -> None:
        self.calls = 0

    def with_credentials(self, _credentials: Any) -> DownGitea:
        return self

    async def update_log(self, *_args: Any, **_kwargs: Any) -> int:
        self.calls += 1
        raise Unavailable("connection refused")


class Backend:
    def __init__(
        self, phases: dict[str, Phase], broken_delete: Collection[str] = (), seqs: dict[str, int] | None = None
    ) -> None:
        self.assignments = {name: make_assignment("p", task_id=i + 1) for i, name in enumerate(phases)}
        self.phases = phases
        self.seqs = seqs or {}
        self.broken_delete = set(broken_delete)
        self.deleted: list[str] = []

    def env(self, name: str) -> Environment:
        a = self.assignments[name]
        labels = {contract.LABEL_ASSIGNMENT_ID: a.assignment_id, contract.LABEL_TASK_ID: str(a.task.id)}
        if name in self.seqs:
            labels[contract.LABEL_STREAM_SEQ] = str(self.seqs[name])
        return Environment(backend="fake", name=name, labels=labels, created_at=datetime.now(UTC))

    async def list_owned(self) -> list[Environment]:
        return [self.env(name) for name in self.phases if name not in self.deleted]

    async def observe(self, env: Environment) -> Observation:
        phase = self.phases[env.name]
        diagnosis = Diagnosis(FailureReason.START_FAILED, "it never started") if phase is Phase.FAILED else None
        return Observation(phase, diagnosis)

    async def load_assignment(self, env: Environment) -> Assignment:
        return self.assignments[env.name]

    async def delete(self, env: Environment) -> None:
        if env.name in self.broken_delete:
            raise OSError("permission denied")
        self.deleted.append(env.name)


async def test_a_gitea_outage_costs_one_finalize_per_round_and_spares_the_rest() -> None:
    backend = Backend({"failed-1": Phase.FAILED, "failed-2": Phase.FAILED, "done": Phase.SUCCEEDED})
    capacity = Capacity("p", 5)
    for a in backend.assignments.values():
        capacity.adopt(a.assignment_id)
    gitea = DownGitea()
    metrics = Metrics()
    reaper = Reaper([PoolWatch("p", backend, capacity, lambda: ())], gitea=gitea, metrics=metrics)  # type: ignore[arg-type]

    await reaper.sweep(reaper._pools[0])

    assert gitea.calls == 1
    assert backend.deleted == ["done"]  # needs no Gitea
    assert capacity.in_use == 2  # the failed ones wait, with their credentials, for Gitea
    assert metrics.sample("dynrunner_errors_total", pool="p", kind="finalize") == 1


async def test_one_environment_that_cannot_be_deleted_does_not_stop_the_round() -> None:
    backend = Backend({"stuck": Phase.SUCCEEDED, "done": Phase.SUCCEEDED}, broken_delete={"stuck"})
    capacity = Capacity("p", 5)
    metrics = Metrics()
    reaper = Reaper([PoolWatch("p", backend, capacity, lambda: ())], gitea=DownGitea(), metrics=metrics)  # type: ignore[arg-type]

    await reaper.sweep(reaper._pools[0])

    assert backend.deleted == ["done"]
    assert metrics.sample("dynrunner_errors_total", pool="p", kind="reaper") == 1


async def test_a_failed_environment_whose_assignment_awaits_redelivery_is_left_alone() -> None:
    """A controller killed between creating an environment and starting its executor: the
    environment looks start-failed, but JetStream still holds its assignment unacknowledged,
    and the redelivery will resume it. Only environments whose message is gone are finalized."""
    backend = Backend(
        {"interrupted": Phase.FAILED, "failed": Phase.FAILED, "unrecorded": Phase.FAILED, "unknown": Phase.FAILED},
        seqs={"interrupted": 7, "failed": 8, "unknown": 9},
    )
    stream = {7: backend.assignments["interrupted"].assignment_id}
    asked: list[int] = []

    async def unacknowledged(env: Environment) -> bool:
        assert env.stream_seq is not None
        asked.append(env.stream_seq)
        if env.stream_seq == 9:
            raise TimeoutError("nats: timeout")
        return stream.get(env.stream_seq) == env.assignment_id

    capacity = Capacity("p", 5)
    gitea = DownGitea()
    metrics = Metrics()
    watch = PoolWatch("p", backend, capacity, lambda: (), unacknowledged=unacknowledged)  # type: ignore[arg-type]
    reaper = Reaper([watch], gitea=gitea, metrics=metrics)  # type: ignore[arg-type]

    await reaper.sweep(watch)

    assert sorted(asked) == [7, 8, 9]
    assert gitea.calls == 1  # "failed" (its message is gone), then Gitea is down for "unrecorded"
    assert backend.deleted == []
    interrupted = backend.assignments["interrupted"].assignment_id
    assert capacity.holds(interrupted)
    assert metrics.sample("dynrunner_errors_total", pool="p", kind="nats") == 1  # "unknown" waits too

    del stream[7]  # redelivered and acknowledged, and yet failed: now it is finalized
    next_round = Reaper([watch], gitea=RecordingGitea(), metrics=metrics)  # type: ignore[arg-type]
    await next_round.sweep(watch)
    assert "interrupted" in backend.deleted and not capacity.holds(interrupted)


class RecordingGitea:
    """A Gitea that takes every report."""

    def with_credentials(self, _credentials: Any) -> RecordingGitea:
        return self

    async def update_log(self, _task_id: int, index: int, rows: Any, **_kwargs: Any) -> int:
        return index + len(rows)

    async def update_task(self, state: Any, *_args: Any, **_kwargs: Any) -> Any:
        from dynrunner.proto.gitea.types import UpdateTaskResult

        return UpdateTaskResult(result=state.result, sent_outputs=frozenset())
