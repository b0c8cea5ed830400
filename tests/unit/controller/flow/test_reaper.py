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
    def __init__(self, phases: dict[str, Phase], broken_delete: Collection[str] = ()) -> None:
        self.assignments = {name: make_assignment("p", task_id=i + 1) for i, name in enumerate(phases)}
        self.phases = phases
        self.broken_delete = set(broken_delete)
        self.deleted: list[str] = []

    def env(self, name: str) -> Environment:
        a = self.assignments[name]
        labels = {contract.LABEL_ASSIGNMENT_ID: a.assignment_id, contract.LABEL_TASK_ID: str(a.task.id)}
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
