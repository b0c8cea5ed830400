"""The reaper's round when Gitea is down or one environment misbehaves: the others are still
reaped, and a Gitea outage costs one finalize attempt per round, not one per environment."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

import pytest

from dynrunner.controller import contract
from dynrunner.controller.assignments.finalize_records import FinalizeRecord, seal_record
from dynrunner.controller.backends.base import Diagnosis, Environment, FailureReason, Observation, Phase
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.coordination.leases import exclusive
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.reaping.reaper import PoolWatch, Reaper
from dynrunner.proto.assignment import CacheServiceOptions
from dynrunner.proto.gitea import Result, TaskState, Unauthenticated, Unavailable
from tests.fixtures.controller_samples import make_assignment
from tests.fixtures.kv_memory import MemoryKeyValue
from tests.fixtures.nats import MemoryFinalizeRecords


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

    async def find(self, assignment_id: str) -> Environment | None:
        for name, a in self.assignments.items():
            if a.assignment_id == assignment_id and name not in self.deleted and name in self.phases:
                return self.env(name)
        return None

    def records(self) -> MemoryFinalizeRecords:
        """The finalize records the launcher wrote for these assignments."""
        records = MemoryFinalizeRecords()
        for a in self.assignments.values():
            records.stored[a.assignment_id] = seal_record(records.sealer, FinalizeRecord.of(a))
        return records

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
    reaper = Reaper(
        [PoolWatch("p", backend, capacity, lambda: (), records=backend.records())], gitea=gitea, metrics=metrics
    )  # type: ignore[arg-type]

    await reaper.sweep(reaper._pools[0])

    assert gitea.calls == 1
    assert backend.deleted == ["done"]  # needs no Gitea
    assert capacity.in_use == 2  # the failed ones wait, with their credentials, for Gitea
    assert metrics.sample("dynrunner_errors_total", pool="p", kind="finalize") == 1


async def test_the_identity_wait_a_backend_observed_is_a_metric() -> None:
    class Waited(Backend):
        async def observe(self, env: Environment) -> Observation:
            return Observation(Phase.SUCCEEDED, identity_wait_s=2.5 if env.name == "waited" else None)

    backend = Waited({"waited": Phase.SUCCEEDED, "local": Phase.SUCCEEDED})
    metrics = Metrics()
    reaper = Reaper(
        [PoolWatch("p", backend, Capacity("p", 5), lambda: (), records=backend.records())],
        gitea=DownGitea(),
        metrics=metrics,
    )  # type: ignore[arg-type]

    await reaper.sweep(reaper._pools[0])

    assert sorted(backend.deleted) == ["local", "waited"]
    assert metrics.sample("dynrunner_identity_wait_seconds_count", pool="p") == 1
    assert metrics.sample("dynrunner_identity_wait_seconds_sum", pool="p") == 2.5


async def test_one_environment_that_cannot_be_deleted_does_not_stop_the_round() -> None:
    backend = Backend({"stuck": Phase.SUCCEEDED, "done": Phase.SUCCEEDED}, broken_delete={"stuck"})
    capacity = Capacity("p", 5)
    metrics = Metrics()
    reaper = Reaper(
        [PoolWatch("p", backend, capacity, lambda: (), records=backend.records())], gitea=DownGitea(), metrics=metrics
    )  # type: ignore[arg-type]

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
    watch = PoolWatch("p", backend, capacity, lambda: (), records=backend.records(), unacknowledged=unacknowledged)  # type: ignore[arg-type]
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


class TakingGitea(RecordingGitea):
    """Takes every report and keeps what was written, per runner."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.runners: list[str] = []

    def with_credentials(self, credentials: Any) -> TakingGitea:
        self.runners.append(credentials.uuid)
        return self

    async def update_log(self, _task_id: int, index: int, rows: Any, **_kwargs: Any) -> int:
        self.rows += [row.content for row in rows]
        return index + len(rows)


async def test_a_vanished_environment_gets_its_task_finalized_from_its_record() -> None:
    """Gone behind our back — reported gone, or simply missing from the next listing — the task
    is finalized failed with the reason, with the credential from the finalize record (the
    environment's own copy is gone with it); the record is deleted and the permit released."""
    backend = Backend({"reported-gone": Phase.GONE, "missing": Phase.RUNNING, "runs": Phase.RUNNING})
    records = backend.records()
    capacity = Capacity("p", 5)
    for a in backend.assignments.values():
        capacity.adopt(a.assignment_id)
    gitea, metrics = TakingGitea(), Metrics()
    watch = PoolWatch("p", backend, capacity, lambda: (), records=records)  # type: ignore[arg-type]
    reaper = Reaper([watch], gitea=gitea, metrics=metrics)  # type: ignore[arg-type]

    await reaper.sweep(watch)
    del backend.phases["missing"]  # rm -rf, kubectl delete pod, a lost node
    await reaper.sweep(watch)

    gone = [backend.assignments[name] for name in ("reported-gone", "missing")]
    assert sorted(gitea.runners) == sorted(a.runner.uuid for a in gone)
    assert len([r for r in gitea.rows if "the job's environment disappeared" in r]) == 2, gitea.rows
    assert all("[vanished]" in r for r in gitea.rows if "disappeared" in r)
    for a in gone:
        assert not capacity.holds(a.assignment_id)
        assert a.assignment_id not in records.stored
    assert capacity.holds(backend.assignments["runs"].assignment_id)
    assert metrics.sample("dynrunner_finalized_failed_total", pool="p", reason="vanished") == 2
    assert metrics.sample("dynrunner_job_results_total", pool="p", result="vanished") == 2


class UnreachableRecords(MemoryFinalizeRecords):
    async def get(self, assignment_id: str) -> FinalizeRecord | None:
        raise TimeoutError("nats: timeout")


async def test_a_finalize_record_that_cannot_be_read_yet_keeps_the_environment() -> None:
    backend = Backend({"failed": Phase.FAILED})
    [a] = backend.assignments.values()
    capacity = Capacity("p", 5)
    capacity.adopt(a.assignment_id)
    unreachable = UnreachableRecords()
    unreachable.stored = backend.records().stored
    metrics = Metrics()
    watch = PoolWatch("p", backend, capacity, lambda: (), records=unreachable)  # type: ignore[arg-type]
    await Reaper([watch], gitea=TakingGitea(), metrics=metrics).sweep(watch)  # type: ignore[arg-type]
    assert backend.deleted == [] and capacity.holds(a.assignment_id)
    assert metrics.sample("dynrunner_errors_total", pool="p", kind="nats") == 1

    watch.records = backend.records()
    gitea = TakingGitea()
    await Reaper([watch], gitea=gitea, metrics=metrics).sweep(watch)  # type: ignore[arg-type]
    assert backend.deleted == ["failed"] and not capacity.holds(a.assignment_id)
    assert any("it never started [start-failed]" in row for row in gitea.rows)


async def test_without_a_finalize_record_the_environment_is_reaped_and_gitea_times_the_task_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = Backend({"failed": Phase.FAILED})
    capacity = Capacity("p", 5)
    gitea = TakingGitea()
    watch = PoolWatch("p", backend, capacity, lambda: (), records=MemoryFinalizeRecords())  # type: ignore[arg-type]
    await Reaper([watch], gitea=gitea, metrics=Metrics()).sweep(watch)  # type: ignore[arg-type]
    assert backend.deleted == ["failed"] and gitea.rows == []
    assert "no finalize record for its task; Gitea's zombie reaper ends it" in caplog.text


class Counting(Backend):
    def __init__(self, phases: dict[str, Phase]) -> None:
        super().__init__(phases)
        self.lists = 0
        self.observed: list[str] = []

    async def list_owned(self) -> list[Environment]:
        self.lists += 1
        return await super().list_owned()

    async def observe(self, env: Environment) -> Observation:
        self.observed.append(env.name)
        return await super().observe(env)


async def test_a_watched_pool_is_looked_at_when_woken_not_every_second() -> None:
    """With a backend that wakes it, the reaper lists once (and again each resync), then looks
    only at the environments it is told changed."""
    backend = Counting({f"idle-{i}": Phase.RUNNING for i in range(50)} | {"done": Phase.RUNNING})
    capacity = Capacity("p", 100)
    watch = PoolWatch("p", backend, capacity, lambda: (), records=backend.records(), watched=True)  # type: ignore[arg-type]
    reaper = Reaper([watch], gitea=TakingGitea(), metrics=Metrics(), interval_s=0.01, resync_s=3600)  # type: ignore[arg-type]
    running = asyncio.create_task(reaper.run())
    try:
        await asyncio.sleep(0.3)
        assert (backend.lists, len(backend.observed)) == (1, 51)  # the first sweep, then nothing
        backend.phases["done"] = Phase.SUCCEEDED
        reaper.wake("p", backend.assignments["done"].assignment_id)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if "done" in backend.deleted:
                break
        assert backend.deleted == ["done"]
        assert (backend.lists, backend.observed[51:]) == (1, ["done"])
        reaper.wake("p")  # lost track: everything again
        await asyncio.sleep(0.1)
        assert backend.lists == 2
    finally:
        reaper.stop()
        await running


async def test_an_environment_still_starting_that_nobody_follows_is_handed_over() -> None:
    """After a controller restart: its start is followed again (stage lines, heartbeats, and for
    a backend that starts the executor itself, the start)."""
    backend = Backend({"starting": Phase.STARTING, "followed": Phase.STARTING, "runs": Phase.RUNNING})
    followed = backend.assignments["followed"].assignment_id
    handed: list[str] = []
    watch = PoolWatch(
        "p",
        backend,  # type: ignore[arg-type]
        Capacity("p", 5),
        lambda: {followed},
        records=backend.records(),
        follow=lambda env: handed.append(env.name),
    )
    await Reaper([watch], gitea=TakingGitea(), metrics=Metrics()).sweep(watch)  # type: ignore[arg-type]
    assert handed == ["starting"]


class RunnerGoneGitea(RecordingGitea):
    """Gitea after the claiming runner was deleted: by Gitea with its task, or by an admin."""

    def __init__(self) -> None:
        self.calls = 0

    async def update_log(self, *_args: Any, **_kwargs: Any) -> int:
        self.calls += 1
        raise Unauthenticated("unregistered runner")


async def test_a_task_whose_runner_is_gone_is_not_counted_as_ended(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 10 item 10: an admin may delete the runner while its task runs; the task then
    stays running in Gitea until its zombie reaper fails it. Nothing says the executor
    reported: the task is counted as runner-gone, and the log line says what may be true."""
    backend = Backend({"failed": Phase.FAILED})
    [a] = backend.assignments.values()
    capacity = Capacity("p", 5)
    capacity.adopt(a.assignment_id)
    gitea, metrics = RunnerGoneGitea(), Metrics()
    watch = PoolWatch("p", backend, capacity, lambda: (), records=backend.records())  # type: ignore[arg-type]
    await Reaper([watch], gitea=gitea, metrics=metrics).sweep(watch)  # type: ignore[arg-type]

    assert gitea.calls == 1 and backend.deleted == ["failed"] and not capacity.holds(a.assignment_id)
    assert metrics.sample("dynrunner_job_results_total", pool="p", result="runner-gone") == 1
    assert metrics.sample("dynrunner_job_results_total", pool="p", result="reported") is None
    assert metrics.sample("dynrunner_finalized_failed_total", pool="p", reason="start-failed") is None
    assert "finalized as failed" not in caplog.text
    assert f"task {a.task.id} not finalized: its runner no longer exists" in caplog.text
    assert "zombie reaper" in caplog.text


class ReportedBackend(Backend):
    """The executor's accepted state shows it finalized before its environment failed."""

    async def observe(self, env: Environment) -> Observation:
        observation = await super().observe(env)
        return dataclasses.replace(observation, reported=TaskState(id=1, result=Result.SUCCESS))


async def test_an_environment_that_failed_after_its_executor_finalized_is_only_reaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A wrapper killed alone, say: no exit status, but Gitea took the executor's final report."""
    caplog.set_level(logging.INFO, logger="dynrunner")
    backend = ReportedBackend({"failed": Phase.FAILED})
    capacity = Capacity("p", 5)
    gitea, metrics = RunnerGoneGitea(), Metrics()
    watch = PoolWatch("p", backend, capacity, lambda: (), records=backend.records())  # type: ignore[arg-type]
    await Reaper([watch], gitea=gitea, metrics=metrics).sweep(watch)  # type: ignore[arg-type]

    assert gitea.calls == 0 and backend.deleted == ["failed"]
    assert metrics.sample("dynrunner_job_results_total", pool="p", result="reported") == 1
    assert "but its executor had finalized the task (success)" in caplog.text
    assert "finalized as failed" not in caplog.text and "not finalized" not in caplog.text


async def test_a_finalized_jobs_cache_registration_is_revoked_and_a_failed_revocation_stops_nothing() -> None:
    """The executor of a failed environment did not revoke its cache registration; the reaper
    does after finalizing, with the token its finalize record keeps. A revocation that fails
    is counted and logged; the environment is reaped all the same (the grant expires at the
    job's deadline)."""
    backend = Backend({"failed-1": Phase.FAILED, "failed-2": Phase.FAILED, "done": Phase.SUCCEEDED})
    for name, a in backend.assignments.items():
        task = dataclasses.replace(a.task, context={**a.task.context, "gitea_runtime_token": f"token-of-{name}"})
        cache = CacheServiceOptions(url="http://cache", v2=True, grant="dcg1.x.y")
        backend.assignments[name] = a.replace(task=task, executor=dataclasses.replace(a.executor, cache=cache))
    capacity = Capacity("p", 5)
    revoked: list[str] = []

    async def revoke(token: str) -> None:
        revoked.append(token)
        if len(revoked) == 1:
            raise OSError("connection refused")

    metrics = Metrics()
    watch = PoolWatch("p", backend, capacity, lambda: (), records=backend.records())  # type: ignore[arg-type]
    reaper = Reaper([watch], gitea=RecordingGitea(), metrics=metrics, revoke_cache=revoke)  # type: ignore[arg-type]
    await reaper.sweep(watch)
    assert sorted(revoked) == ["token-of-failed-1", "token-of-failed-2"]  # not the one whose executor reported
    assert sorted(backend.deleted) == ["done", "failed-1", "failed-2"]
    assert metrics.sample("dynrunner_errors_total", pool="p", kind="cache") == 1


async def test_an_environment_that_vanished_while_its_start_was_followed_is_finalized_after_a_sweep() -> None:
    """A Pod deleted (a node lost) during a long image pull: the full sweep that runs while its
    follower still waits must not forget it. Before, the sweep dropped it from what the reaper
    had seen, and when the follower let go the reaper took the environment for one never ours:
    its task was never finalized and its permit never released (four of them starve a pool of
    four). Found by the controller soak."""
    backend = Backend({"pulling": Phase.STARTING})
    [a] = backend.assignments.values()
    capacity = Capacity("p", 4)
    capacity.adopt(a.assignment_id)
    following = {a.assignment_id}
    gitea = TakingGitea()
    watch = PoolWatch("p", backend, capacity, lambda: following, records=backend.records(), watched=True)  # type: ignore[arg-type]
    reaper = Reaper([watch], gitea=gitea, metrics=Metrics())  # type: ignore[arg-type]

    await reaper.look_at(watch, [a.assignment_id])  # the watch: created (its launcher holds it)
    del backend.phases["pulling"]  # lost with its node while the image is pulled
    await reaper.sweep(watch)  # the periodic full sweep, while the follower still waits
    following.clear()  # the follower's start ends (FAILED, or the backend raised)
    await reaper.look_at(watch, [a.assignment_id])  # its on_end wake

    assert not capacity.holds(a.assignment_id)
    assert any("the job's environment disappeared" in row for row in gitea.rows), gitea.rows


class OverlappingGitea(RecordingGitea):
    """Takes every finalize, slowly enough for two reapers to overlap."""

    def __init__(self) -> None:
        self.rows: dict[int, list[str]] = {}
        self.results: dict[int, list[Any]] = {}

    def with_credentials(self, _credentials: Any) -> OverlappingGitea:
        return self

    async def update_log(self, task_id: int, index: int, rows: Any, **_: Any) -> int:
        await asyncio.sleep(0.05)
        log = self.rows.setdefault(task_id, [])
        log.extend(row.content for row in rows)
        return len(log)

    async def update_task(self, state: TaskState, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.05)
        self.results.setdefault(state.id, []).append(state.result)
        return await super().update_task(state, *args, **kwargs)


async def test_a_failed_environment_two_replicas_see_is_finalized_once_and_not_as_vanished() -> None:
    """Two replicas' reapers over one pool (both see every environment, as replicas see every
    Pod): a failed environment is finalized once — the other replica leaves it while the
    first holds the reaping lease — and the replica that then sees it gone knows from the
    consumed finalize record that it was reaped, instead of finalizing it as vanished."""
    backend = Backend({"failed": Phase.FAILED, "done": Phase.SUCCEEDED})
    records = backend.records()
    leases = MemoryKeyValue()
    gitea = OverlappingGitea()
    metrics = [Metrics(), Metrics()]

    def watch(replica: str) -> PoolWatch:
        lease = functools.partial(exclusive, leases, holder=replica)
        return PoolWatch("p", backend, Capacity("p", 5), lambda: (), records=records, exclusive=lease)  # type: ignore[arg-type]

    reapers = [
        Reaper([watch(name)], gitea=gitea, metrics=m)  # type: ignore[arg-type]
        for name, m in zip(("a", "b"), metrics, strict=True)
    ]
    await asyncio.gather(*(r.sweep(r._pools[0]) for r in reapers))  # both look at once
    task_id = backend.assignments["failed"].task.id
    assert len(gitea.results[task_id]) == 1
    assert sum("[start-failed]" in row for row in gitea.rows[task_id]) == 1
    assert sorted(backend.deleted) == ["done", "failed"]
    await asyncio.gather(*(r.sweep(r._pools[0]) for r in reapers))  # gone now, for both
    await asyncio.gather(*(r.sweep(r._pools[0]) for r in reapers))
    assert len(gitea.results[task_id]) == 1
    for m in metrics:
        assert not m.sample("dynrunner_job_results_total", pool="p", result="vanished")
    finalized = [m.sample("dynrunner_finalized_failed_total", pool="p", reason="start-failed") for m in metrics]
    assert sorted(f or 0 for f in finalized) == [0, 1]
    assert all([await records.consumed(a.assignment_id) for a in backend.assignments.values()])


async def test_a_start_its_follower_ended_is_not_finalized_again_as_vanished(caplog: pytest.LogCaptureFixture) -> None:
    """A run cancelled during its start: the start follower ends the task, deletes the
    environment and consumes its finalize record (counting it cancelled), then lets go. The
    reaper that saw the environment then finds it gone with its record consumed: settled, not
    vanished. Before, a reaper without the replicas' leases counted it vanished as well ("no
    finalize record"), and one with them said another replica had reaped it."""
    backend = Backend({"pulling": Phase.STARTING})
    [a] = backend.assignments.values()
    records = backend.records()
    capacity = Capacity("p", 4)
    capacity.adopt(a.assignment_id)
    following = {a.assignment_id}
    metrics = Metrics()
    watch = PoolWatch("p", backend, capacity, lambda: following, records=records, watched=True)  # type: ignore[arg-type]
    reaper = Reaper([watch], gitea=TakingGitea(), metrics=metrics)  # type: ignore[arg-type]

    await reaper.look_at(watch, [a.assignment_id])  # the watch: created (its follower holds it)
    backend.deleted.append("pulling")  # the follower's end of a cancelled run: environment deleted,
    await records.delete(a.assignment_id)  # record consumed,
    capacity.release(a.assignment_id)  # permit released,
    following.clear()  # and let go (its on_end wake)
    await reaper.look_at(watch, [a.assignment_id])

    assert metrics.sample("dynrunner_job_results_total", pool="p", result="vanished") is None
    assert "no finalize record" not in caplog.text
    assert not capacity.holds(a.assignment_id)
    assert a.assignment_id not in reaper._seen["p"]
