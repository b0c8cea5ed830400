"""The launcher's decisions for one delivery, against the Gitea double and a real local backend:
ack after create, nak with backoff, finalize on the last attempt, stop when the run was
cancelled before the executor started."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.assignments.launched import Launched, Verdict
from dynrunner.controller.backends.base import Environment, StartEvent, StartStage
from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.controller.claiming.build import ClaimSettings, build_assignment
from dynrunner.controller.claiming.registrations_store import ArmedRegistration
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.controller.launching.launcher import Launcher
from dynrunner.controller.reporting.stagelog import Heartbeat
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import Assignment, SealedAssignment
from dynrunner.proto.gitea import GiteaClient, RunnerCredentials, TaskState
from tests.fixtures.backends import DelegatingBackend
from tests.fixtures.deliveries import FakeDelivery
from tests.fixtures.faults import FaultProxy
from tests.fixtures.harness import fake_executor_command, wait_for
from tests.fixtures.nats import MemoryFinalizeRecords, MemoryLaunchRecord

WORKFLOW = "on: push\njobs:\n  build:\n    runs-on: [self-hosted]\n    steps:\n      - run: echo\n"
SEALER = Sealer(b"s" * 32)


class Gate(DelegatingBackend):
    """Wraps a backend: `create` waits for `open` first, or fails when told to."""

    def __init__(self, inner: LocalBackend, *, fail: bool = False) -> None:
        super().__init__(inner)
        self.entered = asyncio.Event()
        self.open = asyncio.Event()
        self.fail = fail

    async def create(self, assignment: Assignment, *, stream_seq: int | None = None) -> Environment:
        self.entered.set()
        await self.open.wait()
        if self.fail:
            raise OSError("no space left on device")
        return await self.inner.create(assignment, stream_seq=stream_seq)


async def claimed_assignment(
    gitea: GiteaDouble, capabilities: tuple[str, ...] = (), *, gitea_url: str | None = None
) -> SealedAssignment:
    base = GiteaClient(gitea.url)
    info = await base.register(
        name="r",
        registration_token=gitea.registration_token,
        labels=["self-hosted"],
        ephemeral=True,
        capabilities=capabilities,
    )
    gitea.submit("owner/repo", WORKFLOW)
    fetched = await base.with_credentials(RunnerCredentials(info.uuid, info.token)).fetch_task(0)
    assert fetched.task is not None
    reg = ArmedRegistration(info.id, info.uuid, info.token, info.name, ("self-hosted",), datetime.now(UTC))
    a = build_assignment(
        fetched.task,
        assignment_id="5f0c2d7e-0000-4000-8000-00000000000a",
        claimed_at=datetime.now(UTC),
        runner=reg,
        settings=ClaimSettings(pool="local", backend="local", gitea_url=gitea_url or gitea.url),
    )
    return SEALER.seal_assignment(a)


def launcher(
    gitea: GiteaDouble,
    backend: object,
    capacity: Capacity,
    metrics: Metrics,
    sealer: Sealer = SEALER,
    pool: str = "local",
    url: str | None = None,
    record: MemoryLaunchRecord | None = None,
    records: MemoryFinalizeRecords | None = None,
) -> Launcher:
    return Launcher(
        pool,
        backend=backend,  # type: ignore[arg-type]
        source=None,  # type: ignore[arg-type]
        sealer=sealer,
        record=record or MemoryLaunchRecord(),
        records=records if records is not None else MemoryFinalizeRecords(),
        gitea=GiteaClient(url or gitea.url),
        capacity=capacity,
        metrics=metrics,
        heartbeat_interval_s=0.05,
    )


@pytest.mark.parametrize("capabilities", [(), ("cancelling",)])
async def test_a_run_cancelled_before_the_start_is_not_started(
    gitea: GiteaDouble, tmp_path: Path, capabilities: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the cancelling capability Gitea ends the task and deletes the runner at once;
    with it, the task is cancelling and the launcher ends it (which deletes the runner)."""
    noticed = heartbeat_ended(monkeypatch)
    sealed = await claimed_assignment(gitea, capabilities)
    gate = Gate(LocalBackend("local", tmp_path / "root", fake_executor_command()))
    capacity, metrics = Capacity("local", 2), Metrics()
    delivery = FakeDelivery(sealed)
    launching = asyncio.create_task(launcher(gitea, gate, capacity, metrics)._launch(delivery))  # type: ignore[arg-type]
    await gate.entered.wait()
    assert capacity.holds(sealed.assignment_id)
    [run] = gitea.runs()
    gitea.cancel_run(run.id)
    # The create is let go once the heartbeat learned of the cancel (a fixed 0.3 s was too
    # short under load: the cancel came after the create, and the start was ended instead).
    await asyncio.wait_for(noticed.wait(), 30)
    gate.open.set()
    await launching
    assert delivery.calls == ["ack"]
    assert not (tmp_path / "root" / sealed.assignment_id).exists()
    assert not capacity.holds(sealed.assignment_id)
    assert metrics.sample("dynrunner_job_results_total", pool="local", result="cancelled") == 1.0
    assert gitea.run(run.id).status == "cancelled"
    assert gitea.task(sealed.task_id).status == "cancelled"
    assert not [r for r in gitea.runners() if not r.deleted]


async def test_a_failed_attempt_is_retried_later(gitea: GiteaDouble, tmp_path: Path) -> None:
    sealed = await claimed_assignment(gitea)
    gate = Gate(LocalBackend("local", tmp_path / "root", fake_executor_command()), fail=True)
    gate.open.set()
    capacity, metrics = Capacity("local", 2), Metrics()
    delivery = FakeDelivery(sealed, num_delivered=2)
    await launcher(gitea, gate, capacity, metrics)._launch(delivery)  # type: ignore[arg-type]
    assert delivery.calls == ["nak 2"]
    assert capacity.holds(sealed.assignment_id)  # still claimed: the next attempt comes
    assert gitea.task(sealed.task_id).status == "running"


async def test_the_last_failed_attempt_finalizes_the_task(gitea: GiteaDouble, tmp_path: Path) -> None:
    sealed = await claimed_assignment(gitea)
    gate = Gate(LocalBackend("local", tmp_path / "root", fake_executor_command()), fail=True)
    gate.open.set()
    capacity, metrics = Capacity("local", 2), Metrics()
    delivery = FakeDelivery(sealed, num_delivered=3)
    await launcher(gitea, gate, capacity, metrics)._launch(delivery)  # type: ignore[arg-type]
    assert delivery.calls == ["term"]
    view = gitea.task(sealed.task_id)
    assert view.status == "failure"
    assert view.log_rows[-1] == (
        "[dynrunner] the job failed: the local environment could not be created (attempt 3 of 3): "
        "OSError: no space left on device"
    )
    assert not capacity.holds(sealed.assignment_id)
    assert metrics.sample("dynrunner_finalized_failed_total", pool="local", reason="launch") == 1.0


async def test_an_unopenable_assignment_is_dropped_after_its_last_attempt(gitea: GiteaDouble, tmp_path: Path) -> None:
    sealed = await claimed_assignment(gitea)
    backend = LocalBackend("local", tmp_path / "root", fake_executor_command())
    other_key = launcher(gitea, backend, Capacity("local", 1), Metrics(), sealer=Sealer(b"x" * 32))
    first, last = FakeDelivery(sealed, num_delivered=1), FakeDelivery(sealed, num_delivered=3)
    await other_key._launch(first)  # type: ignore[arg-type]
    await other_key._launch(last)  # type: ignore[arg-type]
    assert first.calls == ["nak 1"] and last.calls == ["term"]


async def test_a_redelivery_after_the_job_already_ran_starts_nothing(gitea: GiteaDouble, tmp_path: Path) -> None:
    """An attempt whose ack was lost ran the job, which finished and was reaped: the
    redelivered assignment must not run it again."""
    sealed = await claimed_assignment(gitea)
    backend = LocalBackend("local", tmp_path / "root", fake_executor_command())
    capacity, metrics = Capacity("local", 2), Metrics()
    launch = launcher(gitea, backend, capacity, metrics)
    await launch._launch(FakeDelivery(sealed))  # type: ignore[arg-type]
    env = await backend.find(sealed.assignment_id)
    assert env is not None
    await wait_for(lambda: gitea.task(sealed.task_id).status == "success", what="the job ran")
    await backend.delete(env)  # reaped
    again = FakeDelivery(sealed, num_delivered=2)
    await launch._launch(again)  # type: ignore[arg-type]
    assert again.calls == ["ack"]
    assert await backend.find(sealed.assignment_id) is None
    starts = (tmp_path / "starts.log").read_text().splitlines()
    assert len(starts) == 1


class Recording(DelegatingBackend):
    def __init__(self, inner: LocalBackend) -> None:
        super().__init__(inner)
        self.created: list[Assignment] = []

    async def create(self, assignment: Assignment, *, stream_seq: int | None = None) -> Environment:
        self.created.append(assignment)
        return await self.inner.create(assignment, stream_seq=stream_seq)


def tampered(sealed: SealedAssignment) -> SealedAssignment:
    flipped = bytearray(sealed.ciphertext)
    flipped[len(flipped) // 2] ^= 0x20
    return dataclasses.replace(sealed, ciphertext=bytes(flipped))


@pytest.mark.parametrize("how", ["tampered", "other pool"])
async def test_a_forged_delivery_is_refused_and_nothing_runs_or_reports(
    gitea: GiteaDouble, gitea_proxy: FaultProxy, tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A message that does not authenticate, or an authentic one re-published on another pool's
    subject: dropped at once (no retry), logged and counted; no environment, no capacity, not a
    word to Gitea."""
    sealed = await claimed_assignment(gitea)
    backend = Recording(LocalBackend("local", tmp_path / "root", fake_executor_command()))
    capacity, metrics = Capacity("local", 2), Metrics()
    pool = "local" if how == "tampered" else "gpu"
    delivery = FakeDelivery(tampered(sealed) if how == "tampered" else sealed)
    launch = launcher(gitea, backend, capacity, metrics, pool=pool, url=gitea_proxy.url)
    await launch._launch(delivery)  # type: ignore[arg-type]
    assert delivery.calls == ["term"]
    assert backend.created == [] and not any((tmp_path / "root").iterdir())
    assert not capacity.holds(sealed.assignment_id)
    assert gitea_proxy.connections == 0
    view = gitea.task(sealed.task_id)
    assert view.status == "running" and view.log_rows == []
    assert metrics.sample("dynrunner_assignments_refused_total", pool=pool, reason="forged") == 1
    [line] = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "assignment refused (forged) and dropped, nothing was run" in line, line


async def test_the_executor_reports_to_the_configured_gitea_whatever_the_assignment_says(
    gitea: GiteaDouble, tmp_path: Path
) -> None:
    sealed = await claimed_assignment(gitea, gitea_url="http://gitea.attacker.invalid:3000")
    backend = Recording(LocalBackend("local", tmp_path / "root", fake_executor_command()))
    delivery = FakeDelivery(sealed)
    await launcher(gitea, backend, Capacity("local", 1), Metrics())._launch(delivery)  # type: ignore[arg-type]
    assert delivery.calls == ["ack"]
    [created] = backend.created
    assert created.gitea_url == gitea.url
    await wait_for(lambda: gitea.task(sealed.task_id).status == "success", what="the job reported")


async def test_a_replay_of_a_finished_assignment_is_refused_and_nothing_runs_or_reports(
    gitea: GiteaDouble, gitea_proxy: FaultProxy, tmp_path: Path
) -> None:
    """The job ran and was reaped; the same sealed assignment arrives as another stream message
    (copied off NATS and published again): refused from the launch record alone."""
    sealed = await claimed_assignment(gitea)
    backend = LocalBackend("local", tmp_path / "root", fake_executor_command())
    capacity, metrics = Capacity("local", 2), Metrics()
    launch = launcher(gitea, backend, capacity, metrics, url=gitea_proxy.url)
    await launch._launch(FakeDelivery(sealed, stream_seq=5))  # type: ignore[arg-type]
    env = await backend.find(sealed.assignment_id)
    assert env is not None
    await wait_for(lambda: gitea.task(sealed.task_id).status == "success", what="the job ran")
    await backend.delete(env)  # reaped
    capacity.release(sealed.assignment_id)
    connections = gitea_proxy.connections
    replay = FakeDelivery(sealed, stream_seq=9)
    await launch._launch(replay)  # type: ignore[arg-type]
    assert replay.calls == ["term"]
    assert await backend.find(sealed.assignment_id) is None
    assert not capacity.holds(sealed.assignment_id)
    assert gitea_proxy.connections == connections
    assert len((tmp_path / "starts.log").read_text().splitlines()) == 1
    assert metrics.sample("dynrunner_assignments_refused_total", pool="local", reason="replayed") == 1


async def test_a_replay_while_the_job_runs_is_refused_and_the_job_goes_on(gitea: GiteaDouble, tmp_path: Path) -> None:
    sealed = await claimed_assignment(gitea)
    backend = LocalBackend("local", tmp_path / "root", fake_executor_command())
    metrics = Metrics()
    launch = launcher(gitea, backend, Capacity("local", 2), metrics)
    first = FakeDelivery(sealed, stream_seq=5)
    await launch._launch(first)  # type: ignore[arg-type]
    replay = FakeDelivery(sealed, stream_seq=6)
    await launch._launch(replay)  # type: ignore[arg-type]
    assert (first.calls, replay.calls) == (["ack"], ["term"])
    await wait_for(lambda: gitea.task(sealed.task_id).status == "success", what="the job ran")
    assert len((tmp_path / "starts.log").read_text().splitlines()) == 1


async def test_an_assignment_past_its_deadline_is_refused(
    gitea: GiteaDouble, gitea_proxy: FaultProxy, tmp_path: Path
) -> None:
    """Authentic but expired: long after the launch record forgot it, a replay is refused on
    its (authenticated) deadline alone."""
    a = SEALER.unseal_assignment(await claimed_assignment(gitea))
    sealed = SEALER.seal_assignment(a.replace(deadline=datetime.now(UTC) - timedelta(seconds=1)))
    backend = LocalBackend("local", tmp_path / "root", fake_executor_command())
    metrics = Metrics()
    delivery = FakeDelivery(sealed)
    await launcher(gitea, backend, Capacity("local", 1), metrics, url=gitea_proxy.url)._launch(delivery)  # type: ignore[arg-type]
    assert delivery.calls == ["term"]
    assert gitea_proxy.connections == 0 and not any((tmp_path / "root").iterdir())
    assert metrics.sample("dynrunner_assignments_refused_total", pool="local", reason="expired") == 1


class UnreachableRecord(MemoryLaunchRecord):
    async def begin(self, assignment_id: str, stream_seq: int) -> tuple[Verdict, Launched | None]:
        raise TimeoutError("nats: timeout")


async def test_an_assignment_is_not_launched_while_the_launch_record_cannot_be_read(
    gitea: GiteaDouble, tmp_path: Path
) -> None:
    sealed = await claimed_assignment(gitea)
    backend = LocalBackend("local", tmp_path / "root", fake_executor_command())
    metrics = Metrics()
    delivery = FakeDelivery(sealed, num_delivered=2)
    launch = launcher(gitea, backend, Capacity("local", 1), metrics, record=UnreachableRecord())
    await launch._launch(delivery)  # type: ignore[arg-type]
    assert delivery.calls == ["nak 2"]
    assert not any((tmp_path / "root").iterdir())
    assert metrics.sample("dynrunner_errors_total", pool="local", kind="nats") == 1


class UnansweredDelivery(FakeDelivery):
    """NATS does not confirm the launcher's answer (a timeout while it restarts)."""

    async def nak(self, delay_s: float | None = None) -> None:
        raise TimeoutError("nats: timeout")

    async def term(self) -> None:
        raise TimeoutError("nats: timeout")


async def test_an_unconfirmed_answer_to_an_unopenable_assignment_is_logged_not_raised(
    gitea: GiteaDouble, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A launch runs as a task nobody awaits: its failures must be logged where they happen
    (the message simply comes back after ack-wait), not left as an unretrieved task exception."""
    sealed = await claimed_assignment(gitea)
    backend = LocalBackend("local", tmp_path / "root", fake_executor_command())
    other_key = launcher(gitea, backend, Capacity("local", 1), Metrics(), sealer=Sealer(b"x" * 32))
    await other_key._launch(UnansweredDelivery(sealed, num_delivered=1))  # type: ignore[arg-type]
    await other_key._launch(UnansweredDelivery(sealed, num_delivered=3))  # type: ignore[arg-type]
    assert caplog.text.count("nats: timeout") >= 2


class StartedElsewhere(DelegatingBackend):
    """The executor starts without a STARTING event (as a kubelet starts it): the follower
    never gets to stop the heartbeat before a start of its own."""

    async def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:
        async for _ in self.inner.follow_start(env):
            pass
        yield StartEvent(StartStage.STARTED)


async def test_the_heartbeat_stops_when_the_executor_started_without_a_starting_event(
    gitea: GiteaDouble, tmp_path: Path
) -> None:
    """Left beating, the controller's UpdateTask (without the executor's steps) would make the
    executor's finished steps look running again in Gitea."""
    sealed = await claimed_assignment(gitea)
    backend = StartedElsewhere(LocalBackend("local", tmp_path / "root", fake_executor_command()))
    delivery = FakeDelivery(sealed)
    await launcher(gitea, backend, Capacity("local", 1), Metrics())._launch(delivery)  # type: ignore[arg-type]
    assert delivery.calls == ["ack"]
    await wait_for(lambda: gitea.task(sealed.task_id).status == "success", what="the job ran")
    await asyncio.sleep(0.2)
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(("heartbeat-", "start-"))] == []


class AckLost(FakeDelivery):
    """NATS does not confirm the ack (down for longer than the confirmation waits)."""

    async def ack(self) -> None:
        self.calls.append("ack failed")
        raise TimeoutError("nats: timeout")


@pytest.mark.parametrize("attempt", [1, 3])
async def test_an_unconfirmed_ack_leaves_the_started_job_alone(
    gitea: GiteaDouble, tmp_path: Path, attempt: int
) -> None:
    """The environment exists and its executor runs: an ack NATS did not confirm is no launch
    failure. The delivery is left to come back after ack-wait (it then finds the environment
    and only acknowledges); it is neither nak'ed nor, on the last attempt, finalized failed
    with the running environment removed."""
    sealed = await claimed_assignment(gitea)
    backend = LocalBackend("local", tmp_path / "root", fake_executor_command())
    capacity, metrics = Capacity("local", 2), Metrics()
    delivery = AckLost(sealed, num_delivered=attempt)
    await launcher(gitea, backend, capacity, metrics)._launch(delivery)  # type: ignore[arg-type]
    assert all(call == "ack failed" for call in delivery.calls), delivery.calls
    assert await backend.find(sealed.assignment_id) is not None
    assert capacity.holds(sealed.assignment_id)
    await wait_for(lambda: gitea.task(sealed.task_id).status == "success", what="the job ran")
    assert not metrics.sample("dynrunner_finalized_failed_total", pool="local", reason="launch")
    assert not metrics.sample("dynrunner_errors_total", pool="local", kind="launch")


class SlowPull(DelegatingBackend):
    """A start the backend observes instead of making (a kubelet's): progress lines while an
    image is "pulled" (until `pulled` is set), then the executor starts, with no STARTING."""

    def __init__(self, inner: LocalBackend) -> None:
        super().__init__(inner)
        self.pulled = asyncio.Event()

    async def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:
        yield StartEvent(StartStage.PROGRESS, "pod scheduled on node n1")
        yield StartEvent(StartStage.PROGRESS, "pulling image registry.example/executor:1")
        began = time.monotonic()
        await self.pulled.wait()
        yield StartEvent(StartStage.PROGRESS, f"image pulled in {time.monotonic() - began:.1f}s")
        async for event in self.inner.follow_start(env):
            if event.stage.final:
                yield event


def heartbeat_ended(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set once a heartbeat learned from Gitea that its task is over."""
    ended = asyncio.Event()
    run = Heartbeat.run

    async def watched(self: Heartbeat) -> None:
        await run(self)
        if self.ended is not None:
            ended.set()

    monkeypatch.setattr(Heartbeat, "run", watched)
    return ended


def count_update_tasks(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """UpdateTask calls this process makes, by task id (the controller's heartbeats)."""
    calls: dict[int, int] = {}
    update_task = GiteaClient.update_task

    async def counted(self: GiteaClient, state: TaskState, *args: Any, **kwargs: Any) -> Any:
        calls[state.id] = calls.get(state.id, 0) + 1
        return await update_task(self, state, *args, **kwargs)

    monkeypatch.setattr(GiteaClient, "update_task", counted)
    return calls


async def test_a_slow_start_is_followed_with_stage_lines_and_heartbeats_but_holds_no_launch_slot(
    gitea: GiteaDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beats = count_update_tasks(monkeypatch)
    sealed = await claimed_assignment(gitea)
    backend = SlowPull(LocalBackend("local", tmp_path / "root", fake_executor_command()))
    capacity = Capacity("local", 2)
    launch = launcher(gitea, backend, capacity, Metrics())
    delivery = FakeDelivery(sealed)
    await asyncio.wait_for(launch._launch(delivery), 30)  # type: ignore[arg-type]
    # The delivery is answered and the launch is over while the image is still being pulled.
    assert delivery.calls == ["ack"]
    assert launch.launching == set() and launch.busy() == {sealed.assignment_id}
    assert capacity.holds(sealed.assignment_id)
    await wait_for(lambda: len(gitea.task(sealed.task_id).log_rows) == 3, what="the progress lines")
    # Beats go on while it waits (every 0.05 s: 0.5 s held only 4 of them on a loaded machine).
    waiting = time.monotonic()
    first = beats.get(sealed.task_id, 0)
    await wait_for(lambda: beats.get(sealed.task_id, 0) >= first + 5, what="five more heartbeats")
    print(f"5 heartbeats (interval 0.05 s) took {time.monotonic() - waiting:.2f} s")
    assert gitea.task(sealed.task_id).status == "running"
    backend.pulled.set()
    await wait_for(lambda: gitea.task(sealed.task_id).status == "success", what="the job ran")
    rows = gitea.task(sealed.task_id).log_rows
    assert rows[:4] == [
        rows[0],
        "[dynrunner] pod scheduled on node n1",
        "[dynrunner] pulling image registry.example/executor:1",
        rows[3],
    ]
    assert rows[0].startswith("[dynrunner] claimed by pool local as runner ")  # the assignment's, first
    assert rows[3].startswith("[dynrunner] image pulled in ") and len(rows) > 4
    assert not any(row.startswith("[dynrunner]") for row in rows[4:]), rows  # the executor's own from here
    assert launch.busy() == set()
    stopped = beats[sealed.task_id]
    await asyncio.sleep(0.2)
    assert beats[sealed.task_id] == stopped  # no heartbeat once the executor runs


async def test_a_run_cancelled_during_a_slow_start_is_not_started(gitea: GiteaDouble, tmp_path: Path) -> None:
    sealed = await claimed_assignment(gitea)
    backend = SlowPull(LocalBackend("local", tmp_path / "root", fake_executor_command()))
    capacity, metrics, records = Capacity("local", 2), Metrics(), MemoryFinalizeRecords()
    launch = launcher(gitea, backend, capacity, metrics, records=records)
    await launch._launch(FakeDelivery(sealed))  # type: ignore[arg-type]
    assert list(records.stored) == [sealed.assignment_id]  # written before the environment was made
    [run] = gitea.runs()
    gitea.cancel_run(run.id)
    await wait_for(lambda: launch.busy() == set(), what="the follower gives up")
    assert not (tmp_path / "root" / sealed.assignment_id).exists()
    assert not capacity.holds(sealed.assignment_id)
    assert not (tmp_path / "starts.log").exists()
    assert metrics.sample("dynrunner_job_results_total", pool="local", result="cancelled") == 1.0
    assert gitea.task(sealed.task_id).status == "cancelled"
    assert records.stored == {}


async def test_a_start_followed_again_after_a_restart_continues_the_log_where_gitea_has_it(
    gitea: GiteaDouble, tmp_path: Path
) -> None:
    """The controller stopped while an image was pulled; the next one (the reaper hands it the
    environment) follows the start again with the credentials of the finalize record, appending
    after what Gitea holds — nothing overwritten, the executor's rows after all of it."""
    sealed = await claimed_assignment(gitea)
    backend = SlowPull(LocalBackend("local", tmp_path / "root", fake_executor_command()))
    records = MemoryFinalizeRecords()
    first = launcher(gitea, backend, Capacity("local", 2), Metrics(), records=records)
    await first._launch(FakeDelivery(sealed))  # type: ignore[arg-type]
    await wait_for(lambda: len(gitea.task(sealed.task_id).log_rows) == 3, what="the progress lines")
    await first.starts.aclose()  # a shutdown: the start goes on unfollowed

    restarted = launcher(gitea, backend, Capacity("local", 2), Metrics(), records=records)
    env = await backend.find(sealed.assignment_id)
    assert env is not None
    assert restarted.starts.follow(env)
    await wait_for(lambda: len(gitea.task(sealed.task_id).log_rows) == 5, what="the lines again")
    backend.pulled.set()
    await wait_for(lambda: gitea.task(sealed.task_id).status == "success", what="the job ran")
    rows = gitea.task(sealed.task_id).log_rows
    assert rows[1:5] == [
        "[dynrunner] pod scheduled on node n1",
        "[dynrunner] pulling image registry.example/executor:1",
        "[dynrunner] pod scheduled on node n1",
        "[dynrunner] pulling image registry.example/executor:1",
    ]
    assert rows[0].startswith(
        "[dynrunner] claimed by pool local as runner "
    )  # once: a follower after a restart has none
    assert rows[5].startswith("[dynrunner] image pulled in ")
    assert len((tmp_path / "starts.log").read_text().splitlines()) == 1
