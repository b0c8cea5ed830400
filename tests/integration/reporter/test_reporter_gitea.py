"""The reporter against the Gitea double, with a task claimed by an ephemeral runner."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.executor.reporter import Reporter, ReporterConfig
from dynrunner.executor.reporter.accepted import add_to_termination_message
from dynrunner.proto.accepted import decode
from dynrunner.proto.gitea import GiteaClient, Internal, LogRow, Result, RunnerCredentials, TaskState, Unauthenticated
from dynrunner.proto.masking import Masker
from tests.fixtures.reporter_claims import ClaimTask
from tests.fixtures.reporter_wire import Exchange, FaultyWire

CONFIG = ReporterConfig(
    log_interval_s=0.05, log_max_latency_s=0.05, heartbeat_s=0.2, retry_initial_s=0.02, retry_max_s=0.1
)
API_TOKEN = "tok-9f8e7d6c5b4a"
DEPLOY_KEY = "-----BEGIN KEY-----\nMIIEowIBAAKCAQEA7x\nQk9Yb2xk-end\n-----END KEY-----"


async def until(cond: Callable[[], object]) -> None:
    async with asyncio.timeout(10):
        while not cond():  # noqa: ASYNC110 - the double's state is only visible by reading it
            await asyncio.sleep(0.01)


async def test_job_log_steps_outputs_and_close(gitea: GiteaDouble, claim: ClaimTask) -> None:
    c = await claim(steps=3, secrets={"DEPLOY_KEY": DEPLOY_KEY, "API_TOKEN": API_TOKEN})
    token = (c.task.context or {})["token"]
    # The controller wrote stage lines before the executor came up, with the same runner.
    now = datetime.now(UTC)
    stage = [LogRow(now, "claimed by pool pod"), LogRow(now, "pod scheduled on node n1")]
    assert await c.client.update_log(c.task.id, 0, stage) == 2

    rep = Reporter(c.client, c.task.id, c.masker(), CONFIG)
    await rep.start(3)
    rep.log(f"runner token {token}")
    rep.step_started(0)
    rep.log("compiling\nlinking\r\n", step=0)
    rep.log(f"curl -H 'Authorization: Basic {base64.b64encode(f'ci:{API_TOKEN}'.encode()).decode()}'", step=0)
    rep.step_finished(0, Result.SUCCESS)
    rep.step_started(1)
    rep.log(DEPLOY_KEY.replace("\n", "\n  "), step=1)  # printed indented: each line is masked
    rep.log(f'{{"key": "{API_TOKEN}"}}', step=1)
    rep.step_finished(1, Result.FAILURE)
    rep.step_finished(2, Result.SKIPPED)
    rep.set_outputs({"version": "1.2.3"})
    rep.log("cleaning up")
    assert await rep.close(Result.FAILURE) is True

    task = gitea.task(c.task.id)
    assert task.log_rows == [
        "claimed by pool pod",
        "pod scheduled on node n1",
        "runner token ***",
        "compiling",
        "linking",
        "curl -H 'Authorization: Basic Y2k6***'",
        "***",
        "  ***",
        "  ***",
        "  ***",
        '{"key": "***"}',
        "cleaning up",
        "Job failed",
    ]
    assert [(s.status, s.log_index, s.log_length) for s in task.steps] == [
        ("success", 3, 3),
        ("failure", 6, 5),
        ("skipped", 11, 0),
    ]
    assert task.status == "failure"
    assert task.outputs == {"version": "1.2.3"}
    assert task.log_archived
    joined = "\n".join(task.log_rows)
    for secret in (token, API_TOKEN, *DEPLOY_KEY.split("\n")):
        assert secret not in joined

    # Logs with no_more first, then the final UpdateTask, and nothing after it.
    last_log, last_task = c.wire.exchanges[-2:]
    assert last_log.method == "UpdateLog" and last_log.request.no_more and last_log.rows
    assert last_task.method == "UpdateTask" and last_task.request.state.result == Result.FAILURE
    # The final UpdateTask deleted the ephemeral runner.
    assert c.runner.uuid not in {r.uuid for r in gitea.runners()}
    with pytest.raises(Unauthenticated):
        await c.client.update_log(c.task.id, task.log_length, [], retry=None)


async def test_steps_stay_right_in_gitea_while_reports_leave_out_what_it_keeps(
    gitea: GiteaDouble, claim: ClaimTask
) -> None:
    """Reports carry the steps that started and a skipped one until Gitea has it, never the
    untouched ones; between reports (heartbeats included) Gitea still shows every step as it is."""
    c = await claim(steps=4)
    rep = Reporter(c.client, c.task.id, Masker(), replace(CONFIG, transition_window_s=0.01))
    await rep.start(4)
    rep.step_started(0)
    rep.step_finished(0, Result.SUCCESS)
    rep.step_finished(1, Result.SKIPPED)
    rep.step_started(2)

    def statuses() -> list[str]:
        return [s.status for s in gitea.task(c.task.id).steps]

    await until(lambda: statuses()[2] == "running")
    await asyncio.sleep(0.5)  # heartbeats every 0.2 s
    assert statuses() == ["success", "skipped", "running", "waiting"]
    sent = [[s.id for s in e.request.state.steps] for e in c.wire.exchanges if e.method == "UpdateTask"]
    assert len(sent) >= 3 and sent[0] == [0, 1, 2] and all(ids == [0, 2] for ids in sent[1:])
    rep.step_finished(2, Result.FAILURE)
    assert await rep.close(Result.FAILURE)
    assert statuses() == ["success", "skipped", "failure", "cancelled"]


async def test_what_gitea_took_is_kept_in_the_state_file(gitea: GiteaDouble, claim: ClaimTask, tmp_path: Path) -> None:
    """For a controller that finalizes after the executor died (issue 10 item 6): every step
    Gitea holds from this executor, also a skipped one later reports leave out, and the
    result once the task is finalized, each as Gitea stored it."""
    path = tmp_path / "accepted-state.pb"
    c = await claim(steps=4)
    rep = Reporter(c.client, c.task.id, Masker(), replace(CONFIG, transition_window_s=0.01, state_file=str(path)))
    await rep.start(4)
    rep.step_started(0)
    rep.log("built", step=0)
    rep.step_finished(0, Result.SUCCESS)
    rep.step_finished(1, Result.SKIPPED)
    rep.step_started(2)
    await until(lambda: gitea.task(c.task.id).steps[2].status == "running")
    await asyncio.sleep(0.5)  # heartbeats, which carry steps 0 and 2 only

    kept = TaskState.decode(path.read_bytes())
    assert kept.id == c.task.id and kept.result is Result.UNSPECIFIED
    assert [(s.id, s.result) for s in kept.steps] == [(0, Result.SUCCESS), (1, Result.SKIPPED), (2, Result.UNSPECIFIED)]
    stored = gitea.task(c.task.id).steps
    assert [(s.log_index, s.log_length) for s in kept.steps] == [(s.log_index, s.log_length) for s in stored[:3]]
    assert kept.steps[2].started_at is not None and kept.steps[2].stopped_at is None

    rep.step_finished(2, Result.FAILURE)
    assert await rep.close(Result.FAILURE)
    kept = TaskState.decode(path.read_bytes())
    assert kept.result is Result.FAILURE
    assert [s.result for s in kept.steps] == [Result.SUCCESS, Result.SKIPPED, Result.FAILURE, Result.CANCELLED]
    assert not path.with_name(path.name + ".new").exists()


async def test_what_gitea_took_is_the_termination_message_too(
    gitea: GiteaDouble, claim: ClaimTask, tmp_path: Path
) -> None:
    """A Pod's files go with it: the state is also its termination message (issue 18 item 7),
    short, rewritten in place as each report is accepted, and the summary added at the end
    keeps it."""
    message = tmp_path / "termination-log"
    message.touch()  # the kubelet's bind-mounted file
    c = await claim(steps=3)
    config = replace(CONFIG, transition_window_s=0.01, termination_message=str(message))
    rep = Reporter(c.client, c.task.id, Masker(), config)
    await rep.start(3)
    rep.step_started(0)
    rep.step_finished(0, Result.SUCCESS)
    rep.step_started(1)
    await until(lambda: gitea.task(c.task.id).steps[1].status == "running")
    await until(lambda: (kept := decode(message.read_text())) is not None and len(kept.steps) == 2)
    kept = decode(message.read_text())
    assert kept is not None and kept.result is Result.UNSPECIFIED
    started = gitea.task(c.task.id).steps[1].started
    assert [(s.result, s.started_at) for s in kept.steps] == [
        (Result.SUCCESS, None),
        (Result.UNSPECIFIED, datetime.fromtimestamp(started, UTC)),
    ]

    rep.step_finished(1, Result.SUCCESS)
    assert await rep.close(Result.SUCCESS)
    add_to_termination_message(str(message), {"identityWaitSeconds": 1.5})
    kept = decode(message.read_text())
    assert kept is not None and kept.result is Result.SUCCESS
    assert [s.result for s in kept.steps] == [Result.SUCCESS, Result.SUCCESS, Result.CANCELLED]
    assert json.loads(message.read_text())["identityWaitSeconds"] == 1.5


async def test_first_request_reads_the_position_without_writing(gitea: GiteaDouble, claim: ClaimTask) -> None:
    c = await claim(steps=1)
    now = datetime.now(UTC)
    await c.client.update_log(c.task.id, 0, [LogRow(now, f"stage {i}") for i in range(4)])
    rep = Reporter(c.client, c.task.id, Masker(), CONFIG)
    rep.log("logged before start")
    await rep.start(1)
    handshake = c.wire.calls("UpdateLog")[1]
    assert (handshake.request.index, len(handshake.request.rows), handshake.response.ack_index) == (0, 0, 4)
    assert await rep.close(Result.SUCCESS)
    assert gitea.task(c.task.id).log_rows == [f"stage {i}" for i in range(4)] + ["logged before start", "Job succeeded"]


async def test_outputs_are_not_resent_once_stored(gitea: GiteaDouble, claim: ClaimTask) -> None:
    c = await claim(steps=1)
    rep = Reporter(c.client, c.task.id, Masker(), replace(CONFIG, heartbeat_s=0.05))
    await rep.start(1)
    rep.set_outputs({"a": "1", "b": "two"})
    await until(lambda: len(c.wire.calls("UpdateTask")) >= 5)
    assert await rep.close(Result.SUCCESS)
    updates = c.wire.calls("UpdateTask")
    stored_at = next(i for i, e in enumerate(updates) if set(e.response.sent_outputs) == {"a", "b"})
    assert dict(updates[stored_at].request.outputs) == {"a": "1", "b": "two"}
    assert all(not e.request.outputs for e in updates[stored_at + 1 :])
    assert gitea.task(c.task.id).outputs == {"a": "1", "b": "two"}


async def test_cancellation_with_the_cancelling_capability(gitea: GiteaDouble, claim: ClaimTask) -> None:
    c = await claim(steps=2, capabilities=("cancelling",))
    rep = Reporter(c.client, c.task.id, Masker(), replace(CONFIG, heartbeat_s=0.05))
    await rep.start(2)
    rep.step_started(0)
    rep.log("long work", step=0)
    await until(lambda: gitea.task(c.task.id).log_length == 1)
    gitea.cancel_run(c.run.id)
    await asyncio.wait_for(rep.cancelled.wait(), 10)
    assert rep.server_result == Result.CANCELLED
    assert rep.error is None
    rep.log("received cancellation, stopping", step=0)
    assert await rep.close(Result.CANCELLED) is True
    task = gitea.task(c.task.id)
    assert task.status == "cancelled"
    assert task.log_rows == ["long work", "received cancellation, stopping", "Job cancelled"]
    assert [s.status for s in task.steps] == ["cancelled", "cancelled"]
    assert task.log_archived
    assert c.runner.uuid not in {r.uuid for r in gitea.runners()}


async def test_cancellation_without_the_capability_removes_the_runner(gitea: GiteaDouble, claim: ClaimTask) -> None:
    """Gitea's StopTask finalizes the task and deletes the ephemeral runner at once, so the
    executor mostly learns of it as "unregistered runner"; it stops all the same, nothing it
    logs afterwards can reach the log (it goes to stderr), and closing counts as done."""
    c = await claim(steps=1)
    rep = Reporter(c.client, c.task.id, Masker(), replace(CONFIG, heartbeat_s=0.05))
    await rep.start(1)
    rep.step_started(0)
    rep.log("long work", step=0)
    await until(lambda: gitea.task(c.task.id).log_length == 1)
    gitea.cancel_run(c.run.id)
    await asyncio.wait_for(rep.cancelled.wait(), 10)
    # Usually "unregistered runner"; a heartbeat already past authentication when the
    # cancel landed answers with the final result instead.
    assert isinstance(rep.error, Unauthenticated) or rep.server_result == Result.CANCELLED
    assert rep.ended_by_gitea
    rep.log("cleanup output")
    assert await rep.close(Result.CANCELLED) is True
    assert rep.unreported
    task = gitea.task(c.task.id)
    assert task.status == "cancelled"
    assert task.log_rows == ["long work"]


async def test_rows_the_server_did_not_take_are_sent_again(gitea: GiteaDouble, claim: ClaimTask) -> None:
    cut_once = itertools.count()

    def lose_rows(e: Exchange) -> object:
        if e.method == "UpdateLog" and len(e.request.rows) >= 3 and next(cut_once) == 0:
            return ("truncate", 1)
        return None

    c = await claim(steps=1, wire=FaultyWire(lose_rows))
    rep = Reporter(c.client, c.task.id, Masker(), replace(CONFIG, log_interval_s=60, log_max_latency_s=60))
    await rep.start(1)
    rep.step_started(0)
    for i in range(5):
        rep.log(f"line {i}", step=0)
    rep.step_finished(0, Result.SUCCESS)
    assert await rep.close(Result.SUCCESS)
    task = gitea.task(c.task.id)
    assert task.log_rows == [f"line {i}" for i in range(5)] + ["Job succeeded"]
    cut = next(e for e in c.wire.calls("UpdateLog") if e.fault)
    assert cut.response.ack_index == cut.request.index + 1 < cut.request.index + len(cut.request.rows)
    resend = c.wire.calls("UpdateLog")[c.wire.calls("UpdateLog").index(cut) + 1]
    assert resend.request.index == cut.response.ack_index
    assert (task.steps[0].log_index, task.steps[0].log_length) == (0, 5)


async def test_flaky_network_loses_nothing(gitea: GiteaDouble, claim: ClaimTask) -> None:
    counter = itertools.count()

    def flaky(e: Exchange) -> object:
        n = next(counter)
        return "refuse" if n % 3 == 1 else "drop" if n % 5 == 2 else None

    c = await claim(steps=3, wire=FaultyWire(flaky))
    rep = Reporter(c.client, c.task.id, Masker(["s3cr3t-value"]), replace(CONFIG, batch_rows=40))
    await rep.start(3)
    expected = []
    for step in range(3):
        rep.step_started(step)
        for i in range(150):
            rep.log(f"step {step} line {i} s3cr3t-value", step=step)
            expected.append(f"step {step} line {i} ***")
            if i % 25 == 0:
                await asyncio.sleep(0.01)
        rep.step_finished(step, Result.SUCCESS)
    rep.set_outputs({"done": "yes"})
    assert await rep.close(Result.SUCCESS) is True
    task = gitea.task(c.task.id)
    assert task.log_rows == [*expected, "Job succeeded"]
    assert [(s.status, s.log_index, s.log_length) for s in task.steps] == [
        ("success", 0, 150),
        ("success", 150, 150),
        ("success", 300, 150),
    ]
    assert task.outputs == {"done": "yes"}
    assert task.status == "success" and task.log_archived
    faults = [e.fault for e in c.wire.exchanges if e.fault]
    assert "refuse" in faults and "drop" in faults


async def test_legacy_gitea_archives_because_the_last_request_has_a_row(gitea_factory, claim_factory) -> None:
    async with gitea_factory(legacy_empty_no_more=True) as gitea:
        c = await claim_factory(gitea)(steps=1)
        rep = Reporter(c.client, c.task.id, Masker(), replace(CONFIG, closing_line=False))
        await rep.start(1)
        rep.log("all of it")
        await until(lambda: gitea.task(c.task.id).log_length == 1)
        assert await rep.close(Result.SUCCESS)
        task = gitea.task(c.task.id)
        assert task.log_archived
        assert task.log_rows == ["all of it", ""]


async def test_reporting_for_a_task_of_another_runner_fails_at_start(gitea: GiteaDouble, claim: ClaimTask) -> None:
    c = await claim(steps=1)
    other = await GiteaClient(gitea.url).register(
        name="other", registration_token=gitea.registration_token, labels=["self-hosted", "pod"]
    )
    intruder = GiteaClient(gitea.url, RunnerCredentials(other.uuid, other.token))
    rep = Reporter(intruder, c.task.id, Masker(), CONFIG)
    with pytest.raises(Internal, match="invalid runner for task"):
        await rep.start(1)
    assert rep.cancelled.is_set() and isinstance(rep.error, Internal)  # the engine must not run the job
    forged = GiteaClient(gitea.url, RunnerCredentials(c.runner.uuid, "0" * 40))
    with pytest.raises(Unauthenticated):
        await Reporter(forged, c.task.id, Masker(), CONFIG).start(1)
