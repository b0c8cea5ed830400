"""Reporter against an in-memory Gitea: batching triggers, heartbeats, acks, close order."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from dynrunner.executor.reporter import OutputLimitError, Reporter, ReporterClosedError, ReporterConfig
from dynrunner.proto.gitea import Internal, Result, Unauthenticated, Unavailable
from dynrunner.proto.masking import Masker

SLOW = 60.0  # an interval that never fires during a test
FAST = ReporterConfig(
    log_interval_s=SLOW, log_max_latency_s=SLOW, heartbeat_s=SLOW, retry_initial_s=0.01, retry_max_s=0.05
)


async def until(cond: Callable[[], object]) -> None:
    """Poll `cond`: the reporter's effects are visible only in the fake's records."""
    async with asyncio.timeout(5.0):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


class Clock:
    def __init__(self) -> None:
        self._ticks = itertools.count()

    def __call__(self) -> datetime:
        return datetime(2026, 3, 1, tzinfo=UTC) + timedelta(seconds=next(self._ticks))


@pytest.fixture
async def make(fake) -> AsyncIterator[Callable[..., Reporter]]:
    made: list[Reporter] = []

    def factory(config: ReporterConfig = FAST, masker: Masker | None = None, client=None) -> Reporter:
        rep = Reporter(client or fake, fake.task_id, masker or Masker(), config)
        made.append(rep)
        return rep

    yield factory
    for rep in made:
        await rep._stop_pump()


async def test_start_continues_after_rows_already_in_the_log(make_fake, make) -> None:
    fake = make_fake(preexisting=3)
    rep = make(client=fake)
    rep.log("before start")
    await rep.start(1)
    first = fake.calls[0]
    assert (first.kind, first.index, first.rows) == ("log", 0, [])
    rep.step_started(0)
    rep.log("in step", step=0)
    rep.step_finished(0, Result.SUCCESS)
    assert await rep.close(Result.SUCCESS)
    assert fake.contents == ["stage 0", "stage 1", "stage 2", "before start", "in step", "Job succeeded"]
    assert (fake.steps[0].log_index, fake.steps[0].log_length) == (4, 1)


async def test_size_trigger_by_rows(fake, make) -> None:
    rep = make(replace(FAST, batch_rows=5))
    await rep.start(0)
    rep.log("first")
    await until(lambda: fake.contents == ["first"])
    await until(fake.task_calls)  # the start's report, whose window would take the next rows along
    for i in range(3):
        rep.log(f"row {i}")
    await asyncio.sleep(0.05)
    assert len(fake.rows) == 1  # below the trigger, and the interval has not passed
    for i in range(3, 12):
        rep.log(f"row {i}")
    # A full batch sends everything buffered, in requests of at most 5 rows.
    await until(lambda: len(fake.rows) == 13)
    assert [len(c.rows) for c in fake.log_calls()[1:]] == [1, 5, 5, 2]
    await rep.close(Result.SUCCESS)


async def test_size_trigger_by_bytes(fake, make) -> None:
    rep = make(replace(FAST, batch_bytes=1000))
    await rep.start(0)
    rep.log("first")  # leaves at once: nothing was sent for a whole interval
    await until(lambda: fake.contents == ["first"])
    await until(fake.task_calls)  # the start's report, whose window would take the next rows along
    rep.log("x" * 600)
    await asyncio.sleep(0.05)
    assert len(fake.rows) == 1  # below the byte trigger, and the interval has not passed
    rep.log("y" * 600)
    await until(lambda: len(fake.rows) == 3)
    assert [len(c.rows) for c in fake.log_calls()[1:]] == [1, 1, 1]  # never more than 1000 bytes a request
    await rep.close(Result.SUCCESS)


async def test_latency_trigger_sends_a_lone_row(fake, make) -> None:
    rep = make(replace(FAST, log_max_latency_s=0.05))
    await rep.start(0)
    rep.log("lonely")
    await until(lambda: fake.contents == ["lonely"])
    await rep.close(Result.SUCCESS)


async def test_interval_trigger_batches_a_stream(fake, make) -> None:
    rep = make(replace(FAST, log_interval_s=0.1))  # no latency or size trigger
    await rep.start(0)
    for burst in range(4):
        for i in range(5):
            rep.log(f"row {burst}.{i}")
        await asyncio.sleep(0.03)
    await until(lambda: len(fake.rows) == 20)
    assert 1 <= len(fake.log_calls()[1:]) <= 4  # grouped, at most one request per burst
    await rep.close(Result.SUCCESS)


async def test_step_transitions_flush_logs_then_state_at_once(fake, make) -> None:
    rep = make()
    await rep.start(2)
    rep.log("setup")
    rep.step_started(0)
    await until(lambda: any(c.kind == "task" and c.state.steps[0].started_at for c in fake.calls))
    kinds = [(c.kind, len(c.rows)) for c in fake.calls]
    assert kinds.index(("log", 1)) < max(i for i, c in enumerate(fake.calls) if c.kind == "task")
    task = fake.task_calls()[-1]
    assert [s.id for s in task.state.steps] == [0]  # step 1 was not touched: Gitea keeps it waiting
    assert task.state.result == Result.UNSPECIFIED
    rep.log("work", step=0)
    rep.step_finished(0, Result.SUCCESS)
    await until(lambda: fake.steps.get(0) and fake.steps[0].result == Result.SUCCESS)
    assert fake.contents == ["setup", "work"]
    await rep.close(Result.SUCCESS)


async def test_transitions_within_the_window_share_one_log_and_one_state_request(fake, make) -> None:
    """Short steps: their starts and ends (and the task's start) are reported together,
    logs first, with every step's complete state."""
    rep = make(replace(FAST, transition_window_s=0.5))
    await rep.start(3)
    rep.log("setup")  # a lone row leaves at once; the next ones wait for a trigger
    await until(lambda: len(fake.log_calls()) == 2)
    for i in range(3):
        rep.step_started(i)
        rep.log(f"step {i}", step=i)
        await asyncio.sleep(0)  # the pump runs in between: it must wait for the window
        rep.step_finished(i, Result.SUCCESS)
        await asyncio.sleep(0)
    assert [c.kind for c in fake.calls] == ["log", "log"]  # the handshake and "setup" so far
    await until(fake.task_calls)
    assert [(c.kind, len(c.rows)) for c in fake.calls] == [("log", 0), ("log", 1), ("log", 3), ("task", 0)]
    steps = fake.task_calls()[0].state.steps
    assert [(s.result, s.log_index, s.log_length) for s in steps] == [(Result.SUCCESS, i + 1, 1) for i in range(3)]
    assert await rep.close(Result.SUCCESS)


async def test_reports_leave_out_the_steps_gitea_keeps_as_they_are(fake, make) -> None:
    """Gitea keeps a step that a report leaves out as stored, and makes it `running` again if
    it started: untouched steps are left out, a skipped one once Gitea has it, started ones
    never (see reporter/steps.py)."""
    rep = make(replace(FAST, transition_window_s=0.01))
    await rep.start(4)
    rep.step_started(0)
    rep.step_finished(0, Result.SUCCESS)
    rep.step_finished(1, Result.SKIPPED)
    await until(lambda: fake.steps.get(1))
    rep.step_started(2)
    await until(lambda: fake.steps.get(2))
    assert [[s.id for s in c.state.steps] for c in fake.task_calls()] == [[0, 1], [0, 2]]
    assert [(i, s.result) for i, s in sorted(fake.steps.items())] == [
        (0, Result.SUCCESS),
        (1, Result.SKIPPED),
        (2, Result.UNSPECIFIED),
    ]
    await rep.close(Result.SUCCESS)
    assert [s.id for s in fake.task_calls()[-1].state.steps] == [0, 2, 3]
    assert [s.result for s in fake.steps.values()] == [
        Result.SUCCESS,
        Result.SKIPPED,
        Result.CANCELLED,
        Result.CANCELLED,
    ]


async def test_step_times_are_sent_in_whole_seconds(fake, make) -> None:
    rep = make(
        replace(FAST, transition_window_s=0.01, clock=lambda: datetime(2026, 3, 1, 8, 0, 5, 987_654, tzinfo=UTC))
    )
    await rep.start(1)
    rep.step_started(0)
    await until(lambda: fake.steps.get(0))
    assert fake.steps[0].started_at == datetime(2026, 3, 1, 8, 0, 5, tzinfo=UTC)
    await rep.close(Result.SUCCESS)


@pytest.mark.parametrize(("steps", "spacing"), [(30, 0.1), (4000, 0.6)])
async def test_reports_of_a_job_of_many_steps_are_further_apart(fake, make, steps: int, spacing: float) -> None:
    """Each UpdateTask makes Gitea rewrite every step row of the task: a job of 4,000 steps
    (0.15 ms each here: 0.6 s) is reported at most every 0.6 s however fast its steps go,
    where one of 30 steps gets the transition window's 0.1 s."""
    rep = make(replace(FAST, state_spacing_per_step_s=0.00015))
    await rep.start(steps)
    step = 0
    while len(fake.task_calls()) < 4:
        rep.step_started(step % steps)
        rep.step_finished(step % steps, Result.SUCCESS)
        step += 1
        await asyncio.sleep(0.01)
    at = [call.at for call in fake.task_calls()]
    gaps = [later - earlier for earlier, later in itertools.pairwise(at)]
    assert min(gaps) >= spacing * 0.95
    if spacing < 0.5:
        assert min(gaps) < 0.5
    await rep.close(Result.SUCCESS)


async def test_heartbeat_when_nothing_happens(fake, make) -> None:
    rep = make(replace(FAST, heartbeat_s=0.05))
    await rep.start(3)
    await until(lambda: len(fake.task_calls()) >= 4)
    for call in fake.task_calls():
        assert call.state.result == Result.UNSPECIFIED
        assert call.state.steps == []  # none started: each stays waiting in Gitea
    await rep.close(Result.SUCCESS)


async def test_cancellation_is_read_from_update_task(fake, make) -> None:
    rep = make(replace(FAST, heartbeat_s=0.05))
    await rep.start(1)
    rep.step_started(0)
    await until(fake.task_calls)
    assert not rep.cancelled.is_set()
    fake.result = Result.CANCELLED  # a user pressed "cancel"
    await asyncio.wait_for(rep.cancelled.wait(), 5)
    assert rep.server_result == Result.CANCELLED
    rep.log("stopping", step=0)
    assert await rep.close(Result.FAILURE)
    final = fake.task_calls()[-1]
    assert final.state.result == Result.FAILURE  # our own outcome; the server keeps its own
    assert final.state.steps[0].result == Result.CANCELLED
    assert fake.contents[-2:] == ["stopping", "Job failed"]


async def test_outputs_are_resent_until_stored(fake, make) -> None:
    rep = make(replace(FAST, heartbeat_s=0.03))
    await rep.start(0)
    fake.failures = [Unavailable("proxy")]
    rep.set_outputs({"a": "1", "b": "2"})
    await until(lambda: fake.outputs == {"a": "1", "b": "2"})
    await until(lambda: len(fake.task_calls()) >= 4)
    with_outputs = [c.outputs for c in fake.task_calls() if c.outputs]
    assert with_outputs == [{"a": "1", "b": "2"}] * len(with_outputs)
    assert fake.task_calls()[-1].outputs == {}  # not resent once listed in sent_outputs
    await rep.close(Result.SUCCESS)


async def test_outputs_are_spread_over_reports_that_fit_the_request_size(fake, make) -> None:
    """Gitea accumulates outputs over UpdateTasks; each carries what fits `max_request_bytes`
    with its steps (estimated at 64 bytes for the task and 40 a step)."""
    rep = make(replace(FAST, max_request_bytes=10_000))
    await rep.start(2)
    rep.step_started(0)
    rep.step_started(1)
    values = {f"out{i}": str(i) * 4_000 for i in range(5)}
    rep.set_outputs(values)
    await until(lambda: fake.outputs == values)
    carried = [list(c.outputs) for c in fake.task_calls() if c.outputs]
    assert carried == [["out0", "out1"], ["out2", "out3"], ["out4"]]
    await rep.close(Result.SUCCESS)


async def test_close_sends_pending_outputs_before_completing_the_log(fake, make) -> None:
    rep = make(replace(FAST, max_request_bytes=10_000))
    await rep.start(0)
    values = {f"out{i}": "v" * 6_000 for i in range(3)}
    rep.set_outputs(values)  # the pump has not run yet: close sends them
    assert await rep.close(Result.SUCCESS)
    assert fake.outputs == values
    kinds = [(c.kind, list(c.outputs), c.no_more, c.state.result if c.state else None) for c in fake.calls[1:]]
    assert kinds == [
        ("task", ["out0"], False, Result.UNSPECIFIED),
        ("task", ["out1"], False, Result.UNSPECIFIED),
        ("task", ["out2"], False, Result.UNSPECIFIED),
        ("log", [], True, None),
        ("task", [], False, Result.SUCCESS),
    ]


async def test_a_report_refused_as_too_large_sends_one_output_per_report(fake, make) -> None:
    """A front end with a lower body limit than ours answers 413: outputs then go one by one."""
    fake.max_output_bytes = 5_000
    rep = make()
    await rep.start(0)
    values = {f"out{i}": "v" * 4_000 for i in range(3)}
    rep.set_outputs(values)
    await until(lambda: fake.outputs == values)
    carried = [list(c.outputs) for c in fake.task_calls() if c.outputs]
    assert carried == [["out0", "out1", "out2"], ["out0"], ["out1"], ["out2"]]
    assert rep.error is None
    assert await rep.close(Result.SUCCESS)


async def test_an_output_refused_alone_is_given_up_and_the_log_says_why(fake, make) -> None:
    fake.max_output_bytes = 5_000
    rep = make()
    await rep.start(0)
    rep.set_outputs({"big": "v" * 6_000, "small": "s"})
    assert await rep.close(Result.SUCCESS)
    assert fake.outputs == {"small": "s"} and fake.result == Result.SUCCESS
    assert fake.contents[:-1] == [
        "##[error]Job output 'big' was not stored: a proxy in front of Gitea refused the request carrying it "
        "(6015 bytes) as too large (HTTP 413). Its request body limit (nginx: client_max_body_size) must be "
        "above 1 MiB for outputs this large."
    ]
    assert fake.log_calls()[-1].no_more and fake.contents[-1] == "Job succeeded"


async def test_outputs_over_gitea_limits_are_refused_by_name(fake, make) -> None:
    rep = make()
    await rep.start(0)
    with pytest.raises(OutputLimitError) as caught:
        rep.set_outputs({"ok": "fine", "k" * 256: "v", "big": "x" * (1024 * 1024 + 1)})
    problems = {(v.key[:3], v.limit, v.size) for v in caught.value.violations}
    assert problems == {("kkk", "key", 256), ("big", "value", 1024 * 1024 + 1)}
    assert "'big': value is 1048577 bytes, the limit is 1048576 bytes" in str(caught.value)
    assert await rep.close(Result.SUCCESS)
    assert fake.outputs == {"ok": "fine"}


async def test_close_sends_no_more_first_then_the_final_state(fake, make) -> None:
    rep = make()
    await rep.start(3)
    rep.step_started(0)
    rep.log("a", step=0)
    rep.step_finished(0, Result.SUCCESS)
    rep.step_started(1)
    assert await rep.close(Result.CANCELLED) is True
    log_call, task_call = fake.calls[-2:]
    assert log_call.kind == "log" and log_call.no_more and log_call.rows
    assert task_call.kind == "task" and task_call.state.result == Result.CANCELLED
    assert task_call.state.stopped_at is not None
    assert [s.result for s in task_call.state.steps] == [Result.SUCCESS, Result.CANCELLED, Result.CANCELLED]
    assert fake.archived and fake.runner_deleted
    calls = len(fake.calls)
    assert await rep.close(Result.SUCCESS) is True  # idempotent, sends nothing
    assert len(fake.calls) == calls
    with pytest.raises(ReporterClosedError):
        rep.log("too late")
    with pytest.raises(ReporterClosedError):
        rep.step_finished(2, Result.SUCCESS)
    with pytest.raises(ReporterClosedError):
        rep.set_outputs({"late": "1"})
    assert len(fake.calls) == calls


async def test_close_needs_a_result(fake, make) -> None:
    rep = make()
    await rep.start(0)
    with pytest.raises(ValueError, match="UNSPECIFIED"):
        await rep.close(Result.UNSPECIFIED)
    assert await rep.close(Result.SUCCESS)


async def test_skipped_job_marks_every_step_skipped(fake, make) -> None:
    rep = make()
    await rep.start(2)
    assert await rep.close(Result.SKIPPED, skipped=True)
    assert [s.result for s in fake.steps.values()] == [Result.SKIPPED, Result.SKIPPED]
    assert fake.contents == ["Job skipped"]


async def test_final_log_request_always_carries_a_row(fake, make) -> None:
    rep = make(replace(FAST, closing_line=False, log_max_latency_s=0.01))
    await rep.start(0)
    rep.log("everything")
    await until(lambda: fake.contents == ["everything"])
    assert await rep.close(Result.SUCCESS)
    final = fake.log_calls()[-1]
    assert final.no_more and [r.content for r in final.rows] == [""]
    assert fake.archived


async def test_transient_failures_lose_nothing(fake, make) -> None:
    rep = make(replace(FAST, batch_rows=3))
    await rep.start(1)
    fake.failures = [Unavailable("down"), Internal("database is locked"), Unavailable("down")] * 3
    rep.step_started(0)
    for i in range(20):
        rep.log(f"line {i}", step=0)
        await asyncio.sleep(0)
    rep.step_finished(0, Result.SUCCESS)
    assert await rep.close(Result.SUCCESS)
    assert fake.contents == [f"line {i}" for i in range(20)] + ["Job succeeded"]
    assert (fake.steps[0].log_index, fake.steps[0].log_length) == (0, 20)
    assert rep.error is None


async def test_permanent_failure_stops_reporting_and_is_surfaced(fake, make) -> None:
    rep = make()
    fake.failures = [Unavailable("x")]
    await rep.start(0)  # the handshake survives a transient error
    fake.refusal = Internal("update task: invalid runner for task")  # the first state report after start
    await asyncio.wait_for(rep.cancelled.wait(), 5)
    assert isinstance(rep.error, Internal)
    assert rep.server_result == Result.UNSPECIFIED
    assert not rep.ended_by_gitea  # a refusal that says nothing about the task's end (see test_task_ended)
    assert await rep.close(Result.FAILURE) is False


async def test_server_that_lost_rows_gets_them_again(fake, make) -> None:
    rep = make(replace(FAST, batch_rows=4))
    await rep.start(0)
    for i in range(8):
        rep.log(f"r{i}")
    await until(lambda: len(fake.rows) == 8)
    fake.lose_rows_after = 5  # e.g. a database restored from a slightly older state
    for i in range(8, 12):
        rep.log(f"r{i}")
    assert await rep.close(Result.SUCCESS)
    assert fake.contents == [f"r{i}" for i in range(12)] + ["Job succeeded"]
    assert any(c.index > c.ack for c in fake.log_calls() if c.ack is not None)  # it answered a lower ack


async def test_rows_someone_else_wrote_meanwhile_are_kept_before_ours(fake, make) -> None:
    rep = make(replace(FAST, batch_rows=2))
    await rep.start(2)
    rep.step_started(0)
    rep.log("a", step=0)
    rep.log("b", step=0)
    await until(lambda: len(fake.rows) == 2)
    # More foreign rows than we send next, so the ack tells them apart from ours.
    fake.rows.extend(replace(fake.rows[0], content=f"foreign {i}") for i in range(5))
    rep.log("c", step=0)
    rep.step_finished(0, Result.SUCCESS)
    rep.step_started(1)
    rep.log("d", step=1)
    rep.step_finished(1, Result.SUCCESS)
    assert await rep.close(Result.SUCCESS)
    assert fake.contents == ["a", "b"] + [f"foreign {i}" for i in range(5)] + ["c", "d", "Job succeeded"]
    s0, s1 = fake.steps[0], fake.steps[1]
    assert (s0.log_index, s0.log_length, s1.log_index, s1.log_length) == (0, 8, 8, 1)


async def test_lost_final_answer_counts_as_finalized(fake, make) -> None:
    rep = make()
    await rep.start(0)

    real = fake.update_task

    async def deliver_then_drop(state, outputs=None, *, retry=None):
        answer = await real(state, outputs, retry=retry)
        if state.result != Result.UNSPECIFIED:
            raise Unavailable("connection reset after the request was handled")
        return answer

    fake.update_task = deliver_then_drop
    assert await rep.close(Result.SUCCESS) is True
    assert fake.result == Result.SUCCESS


async def test_close_gives_up_within_its_deadline(fake, make) -> None:
    rep = make(replace(FAST, close_timeout_s=0.3))
    await rep.start(0)
    fake.failures = [Unavailable("down")] * 10_000
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await rep.close(Result.SUCCESS) is False
    assert loop.time() - began < 5  # bounded (generous: only "it returns" matters)
    assert isinstance(rep.error, Unavailable)


async def test_close_without_start_still_continues_the_log(make_fake, make) -> None:
    fake = make_fake(preexisting=2)
    rep = make(client=fake)
    rep.log("failed before the job could start")
    assert await rep.close(Result.FAILURE)
    assert fake.contents == ["stage 0", "stage 1", "failed before the job could start", "Job failed"]


async def test_rows_are_masked_repaired_split_and_capped(fake, make) -> None:
    masker = Masker(["topsecret-value"])
    rep = make(replace(FAST, clock=Clock()), masker=masker)
    await rep.start(0)
    rep.log("token=topsecret-value\r\nnext line\n")
    rep.log(b"bad \xff byte")
    rep.log("z" * 70_000)
    masker.add("added-later")
    rep.log("now added-later is hidden")
    assert await rep.close(Result.SUCCESS)
    contents = fake.contents
    assert contents[:3] == ["token=***", "next line", "bad \ufffd byte"]
    assert len(contents[3].encode()) <= 65536 and "row truncated" in contents[3]
    assert contents[4] == "now *** is hidden"
    times = [r.time for r in fake.rows]
    assert times[0] == times[1] < times[2] < times[3]  # one timestamp per log() call, from the clock


async def test_a_chunk_of_output_is_masked_and_capped_line_by_line(fake, make) -> None:
    masker = Masker(["topsecret-value", "-----KEY-----\nbody-line-of-key\n-----END-----"])
    rep = make(masker=masker)
    await rep.start(0)
    plain = [f"line {i}" for i in range(500)]
    rep.log("\n".join(plain) + "\n")
    rep.log("a\nuses topsecret-value here\nb\n" + "ü" * 40_000 + "\n-----KEY-----\nbody-line-of-key\nc")
    assert await rep.close(Result.SUCCESS)
    contents = fake.contents
    assert contents[:500] == plain
    assert contents[500:503] == ["a", "uses *** here", "b"]
    assert len(contents[503].encode()) <= 65536 and "row truncated" in contents[503]
    assert contents[504:507] == ["***", "***", "c"]
    assert rep.backlog_bytes == 0


async def test_throttle_bounds_the_backlog_of_a_fast_step(fake, make) -> None:
    fake.delay_s = 0.01  # Gitea takes rows slower than the step prints them
    rep = make(replace(FAST, max_backlog_bytes=4000, batch_rows=10))
    await rep.start(0)
    worst = 0
    for i in range(300):
        rep.log(f"line {i:04d} " + "x" * 80)
        await rep.throttle()
        worst = max(worst, rep.backlog_bytes)
    assert worst <= 4000
    assert await rep.close(Result.SUCCESS)
    assert fake.contents[:300] == [f"line {i:04d} " + "x" * 80 for i in range(300)]


async def test_throttle_never_blocks_when_reporting_cannot_progress(fake, make) -> None:
    rep = make(replace(FAST, max_backlog_bytes=100))
    rep.log("x" * 500)
    await asyncio.wait_for(rep.throttle(), 1)  # not started
    await rep.start(0)
    fake.runner_deleted = True
    rep.log("y" * 500)
    await asyncio.wait_for(rep.throttle(), 5)  # fails permanently instead of draining
    assert isinstance(rep.error, Unauthenticated)


async def test_close_is_bounded_even_when_gitea_never_answers(fake, make) -> None:
    rep = make(replace(FAST, close_timeout_s=0.4, request_timeout_s=30))
    await rep.start(0)
    rep.log("stuck")
    never = asyncio.Event()

    async def hang(*args, **kwargs):
        await never.wait()

    fake.update_log = hang
    fake.update_task = hang
    async with asyncio.timeout(5):
        assert await rep.close(Result.SUCCESS) is False
    assert isinstance(rep.error, Unavailable)


async def test_close_waits_for_the_request_in_flight_before_sending_its_own(fake, make) -> None:
    """Gitea finishes a request the client abandoned, and its UpdateLog is not atomic: two at
    one index left NUL bytes in the stored log (1.24, 1.25). Close lets the pump's batch be
    answered, then sends the rest after it: one UpdateLog at a time."""
    fake.completes_abandoned = True
    rep = make(replace(FAST, log_max_latency_s=0.0))
    await rep.start(0)
    fake.delay_s = 0.3
    rep.log("in flight")
    await until(lambda: len(fake.log_calls()) == 2)
    rep.log("logged while it was on the wire")
    async with asyncio.timeout(5):
        assert await rep.close(Result.SUCCESS)
    assert fake.most_in_flight == 1
    assert fake.contents == ["in flight", "logged while it was on the wire", "Job succeeded"]
    assert [c.index for c in fake.log_calls()] == [0, 0, 1, 2]


@pytest.mark.parametrize("cancel_as_error", [False, True])
async def test_close_interrupts_a_request_in_flight_past_the_log_deadline(fake, make, cancel_as_error: bool) -> None:
    """A request still unanswered when the logs' half of the close timeout ends is cancelled;
    connectrpc turns that into a transient "Canceled" error, which stopping the pump must not
    take for a failure to retry."""
    fake.cancel_as_error = cancel_as_error
    rep = make(replace(FAST, log_max_latency_s=0.0, close_timeout_s=1.0))
    await rep.start(0)
    fake.delay_s = 30
    rep.log("in flight")
    await until(lambda: len(fake.log_calls()) == 2)
    fake.delay_s = 0
    async with asyncio.timeout(5):
        assert await rep.close(Result.SUCCESS)
    assert fake.contents == ["in flight", "Job succeeded"]


async def test_cancelling_close_stops_its_retries(fake, make) -> None:
    fake.cancel_as_error = True
    rep = make(replace(FAST, close_timeout_s=60))
    await rep.start(0)
    fake.delay_s = 30
    rep.log("x")
    closing = asyncio.create_task(rep.close(Result.SUCCESS))
    await until(lambda: len(fake.log_calls()) >= 2)
    closing.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await closing


async def test_no_state_report_names_rows_gitea_has_not_got(fake, make) -> None:
    """Heartbeats and step transitions while a step prints: every report goes after the rows
    it names (an executor killed right after one left a finished step without its output)."""
    rep = make(replace(FAST, heartbeat_s=0.02, log_interval_s=0.03, log_max_latency_s=0.03))
    await rep.start(2)
    rep.step_started(0)
    for i in range(30):
        rep.log(f"row {i}", step=0)
        if i == 15:
            rep.step_finished(0, Result.SUCCESS)
            rep.step_started(1)
        await asyncio.sleep(0.005)
    await until(lambda: len(fake.task_calls()) >= 4)
    assert await rep.close(Result.SUCCESS)
    for call in fake.task_calls():
        assert call.state is not None and call.ack is not None
        for step in call.state.steps:
            assert step.log_index + step.log_length <= call.ack, (call.state.steps, call.ack)
