"""Reports one task's log and state to Gitea, as a first-class runner does.

The engine calls `log`, `step_started`, `step_finished` and `set_outputs` synchronously;
a background pump turns them into UpdateLog and UpdateTask calls (logs first, so a step's
state never points at rows Gitea has not got). Every row is repaired to valid UTF-8, split
per line, masked and capped here, so no path to the job log can skip masking.

Failures: transient errors (Gitea down, 5xx, timeouts) keep everything buffered and are
retried with backoff; a permanent one stops reporting, is kept in `error` and sets
`cancelled` so the engine stops. Cancellation from Gitea arrives in UpdateTask answers (any
final result there is kept in `server_result`), or, on Gitea 1.24-1.26, as a refusal that
shows Gitea ended the task (the runner deleted with it, see `unreported`): from then on the
job's rows go to the executor's stderr, and `close` has nothing left to send. Either way
`ended_by_gitea` is true and `cancelled` set.

Closing follows the order ephemeral runners need: UpdateLog with ``no_more`` first, then
the final UpdateTask, which makes Gitea delete the runner; nothing is sent after it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import NoReturn, TypeVar

from dynrunner.executor.reporter.accepted import AcceptedState
from dynrunner.executor.reporter.config import ReporterConfig
from dynrunner.executor.reporter.logbuffer import ROW_OVERHEAD, LogBuffer
from dynrunner.executor.reporter.outputs import Outputs
from dynrunner.executor.reporter.rows import MAX_ROW_BYTES, cap, split_rows, utf8_size, valid_utf8
from dynrunner.executor.reporter.steps import StepTracker
from dynrunner.executor.reporter.unreported import UnreportedOutput, ends_task, why_ended
from dynrunner.proto.gitea import (
    GiteaClient,
    GiteaError,
    LogRow,
    RequestTooLarge,
    Result,
    StepState,
    TaskState,
    Unauthenticated,
    Unavailable,
    UpdateTaskResult,
)
from dynrunner.proto.gitea.client import NO_RETRY
from dynrunner.proto.masking import Masker

log = logging.getLogger(__name__)

DEFAULT_CONFIG = ReporterConfig()
# Wire bytes of an UpdateTask beyond its outputs: the task's state, and at most this much per
# step (whole-second times, indexes below 2^35).
_TASK_BYTES = 64
_STEP_BYTES = 40

T = TypeVar("T")

_CLOSING_WORDS = {
    Result.SUCCESS: "Job succeeded",
    Result.FAILURE: "Job failed",
    Result.CANCELLED: "Job cancelled",
    Result.SKIPPED: "Job skipped",
}


class ReporterClosedError(RuntimeError):
    """The reporter was closed: the task is final in Gitea and nothing more can be sent."""


class Reporter:
    def __init__(
        self, client: GiteaClient, task_id: int, masker: Masker, config: ReporterConfig = DEFAULT_CONFIG
    ) -> None:
        self.task_id = task_id
        self.cancelled = asyncio.Event()
        self.server_result = Result.UNSPECIFIED
        self.error: BaseException | None = None
        self._client = client
        self._masker = masker
        self._cfg = config
        self._clock = config.clock
        self._buffer = LogBuffer(retain_acked=config.retain_acked_rows)
        self._steps = StepTracker(0)
        self._outputs = Outputs()
        self._accepted = AcceptedState(config.state_file, config.termination_message)
        self._started_at: datetime | None = None
        self._handshaken = False
        self._wake = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._pump_stop = asyncio.Event()
        self._state_due = False
        self._transition_at: float | None = None  # when step transitions seen so far must be reported
        self._flush_to: int | None = None  # rows up to here leave without waiting
        self._state_after: int | None = None  # an urgent state report waits for rows up to here
        self._rows_sent_for_state = False  # the rows logged before the state became due are acked
        self._report: tuple[list[StepState], dict[int, int]] | None = None  # the steps as at `_state_after`
        self._unsent_since: float | None = None
        self._last_log_send = float("-inf")
        self._last_state_send = float("-inf")
        self._state_spacing = 0.0  # least time between state reports, for the job's step count
        self._failures = 0
        self._drained = asyncio.Event()
        self._closing = False
        self._deadline: float | None = None  # while closing: when to give up
        self._finalized: bool | None = None
        self._unreported: UnreportedOutput | None = None
        self._closing_row_buffered = False

    @property
    def ended_by_gitea(self) -> bool:
        """Gitea ended the task under the job: it answered a result of its own (a cancel, a
        reaper), or refused a report in a way that shows the task is over (`unreported`)."""
        return self.server_result != Result.UNSPECIFIED or self._unreported is not None

    @property
    def unreported(self) -> bool:
        """Gitea ended the task and takes no more reports: the job's rows go to the executor's
        stderr (`ReporterConfig.unreported_output`), and closing sends nothing."""
        return self._unreported is not None

    # -- what the engine calls ------------------------------------------------------

    async def start(self, step_count: int) -> None:
        """Continue the log where Gitea has it (the controller may have written stage lines)
        and start reporting in the background. Raises the GiteaError when Gitea cannot be
        reached within `start_timeout_s`, or refuses (then `cancelled` and `error` are set
        too); rows logged meanwhile stay buffered and `close` tries again."""
        if self._pump is not None or self._closing:
            raise RuntimeError("reporter already started")
        self._steps = StepTracker(step_count)
        self._state_spacing = min(self._cfg.heartbeat_s, step_count * self._cfg.state_spacing_per_step_s)
        self._started_at = self._clock()
        try:
            await self._handshake(time.monotonic() + self._cfg.start_timeout_s)
        except Exception as err:
            if not _transient(err):
                self._fail(err)  # the task can never be reported: the job must not run
            raise
        self._last_state_send = time.monotonic()  # heartbeats count from here
        self._transition()  # the first report: the task's start, with whatever steps started by then
        self._pump = asyncio.create_task(self._run(), name=f"reporter-task-{self.task_id}")

    def log(self, text: str | bytes, step: int | None = None) -> None:
        """Append `text` to the job log, one row per line, masked."""
        if self._closing:
            self._closed("log")
        if self._unreported is not None:
            self._unreported.log(text)
            return
        now = self._clock()
        buffer = self._buffer
        if type(text) is str and "\n" not in text and text.isascii():  # the usual case: one plain line
            content = cap(self._masker.mask(text[:-1] if text.endswith("\r") else text))
            row = buffer.append(LogRow(time=now, content=content), utf8_size(content) + ROW_OVERHEAD)
        else:
            row = self._log_lines(valid_utf8(text), now)
        self._steps.on_row(row, step)
        if self._unsent_since is None:
            self._unsent_since = time.monotonic()
            self._wake.set()
        if buffer.pending >= self._cfg.batch_rows or buffer.pending_bytes >= self._cfg.batch_bytes:
            self._flush_to = buffer.end
            self._wake.set()

    def _log_lines(self, text: str, now: datetime) -> int:
        """Rows for every line of `text`; returns the index of the last. A chunk of output is
        checked for secrets and for long lines as a whole first: most chunks have neither, and
        then no line needs a look of its own."""
        lines = split_rows(text)
        if self._masker.contains_secret(text):
            lines = [self._masker.mask(line) for line in lines]
        ascii_only = text.isascii()
        if max(map(len, lines)) * (1 if ascii_only else 4) > MAX_ROW_BYTES:
            lines = [cap(line) for line in lines]
            ascii_only = False
        if ascii_only:
            sizes = [len(line) + ROW_OVERHEAD for line in lines]
        else:
            sizes = [utf8_size(line) + ROW_OVERHEAD for line in lines]
        return self._buffer.extend([LogRow(time=now, content=line) for line in lines], sizes)

    @property
    def backlog_bytes(self) -> int:
        """Bytes of log rows Gitea has not acknowledged yet."""
        return self._buffer.pending_bytes

    async def throttle(self) -> None:
        """Wait while more than `max_backlog_bytes` of rows await Gitea (until half of it is
        left), so a step that prints faster than Gitea takes it is slowed down through its
        own output pipe instead of growing the executor's memory. Does not wait when
        reporting cannot make progress any more (not started, failed, closing, ended by Gitea).

        Always lets the event loop run once: a step's pipe that never runs dry is read without
        ever suspending otherwise, and nothing else would run — not even what stops that step
        (a cancel seen while its output goes to stderr kept a step printing without pause
        running for ever)."""
        await asyncio.sleep(0)
        limit = self._cfg.max_backlog_bytes
        if self._buffer.pending_bytes <= limit:
            return
        while self._buffer.pending_bytes > limit // 2 and self._pump_alive():
            self._drained.clear()
            self._flush_to = self._buffer.end
            self._wake.set()
            await self._drained.wait()

    def _pump_alive(self) -> bool:
        return self._pump is not None and not self._pump.done() and not self._closing

    def step_started(self, index: int) -> None:
        if self._closing:
            self._closed("step_started")
        self._steps.start(index, self._clock(), self._buffer.end)
        self._transition()

    def step_finished(self, index: int, result: Result) -> None:
        if self._closing:
            self._closed("step_finished")
        self._steps.finish(index, result, self._clock(), self._buffer.end)
        self._transition()

    def set_outputs(self, outputs: Mapping[str, str]) -> None:
        """Queue job outputs for Gitea. Raises OutputLimitError for those over Gitea's
        limits (they are not sent); the valid ones are queued regardless."""
        if self._closing:
            self._closed("set_outputs")
        if self._unreported is not None:
            self._unreported.say(f"task {self.task_id}: job outputs not reported: {', '.join(sorted(outputs))}")
            return
        try:
            if self._outputs.set(outputs):
                self._state_due = True
        finally:
            self._wake.set()

    async def close(self, result: Result, *, skipped: bool = False) -> bool:
        """Finish the task in Gitea with `result`; returns whether it was finalized.

        Unfinished steps become CANCELLED (SKIPPED when the job was `skipped`). Sends the
        remaining rows with ``no_more``, then the final UpdateTask, each retried on
        transient errors within `close_timeout_s`; the logs get at most half of it."""
        if result == Result.UNSPECIFIED:
            raise ValueError("close() needs the job's result; UNSPECIFIED would not end the task")
        if self._finalized is not None:
            return self._finalized
        if self._closing:
            raise RuntimeError("close already in progress")
        self._closing = True
        started = time.monotonic()
        await self._stop_pump(started + self._cfg.close_timeout_s / 2)
        closing = _CLOSING_WORDS[result] if self._cfg.closing_line else ""
        if self._unreported is None:
            now = self._clock()
            self._steps.close(now, skipped=skipped)
            state = TaskState(id=self.task_id, result=result, started_at=self._started_at or now, stopped_at=now)
            self._deadline = started + self._cfg.close_timeout_s / 2
            await self._final_logs(closing)
            if self._unreported is None:
                self._deadline = started + self._cfg.close_timeout_s
                self._finalized = await self._final_state(state)
                return self._finalized
        # Gitea ended the task: nothing can be sent, and nothing is left for anyone to end.
        out = self._unreported
        assert out is not None
        rows = [row.content for row in self._buffer.give_up()]
        if closing and not self._closing_row_buffered:  # else it went with the rows Gitea refused
            rows.append(closing)
        out.rows(rows)
        self._finalized = True
        return True

    def _closed(self, what: str) -> NoReturn:
        raise ReporterClosedError(f"task {self.task_id}: {what} after close (the final report ends the task)")

    # -- background pump ------------------------------------------------------------

    def _transition(self) -> None:
        """Report step transitions within the window that the first unreported one opens, and
        no sooner after the previous report than the job's size allows (`_state_spacing`)."""
        if self._transition_at is None:
            window = time.monotonic() + self._cfg.transition_window_s
            self._transition_at = max(window, self._last_state_send + self._state_spacing)
            self._wake.set()

    def _transitions_due(self, now: float) -> float:
        """When pending transitions must go out; once due, the rows logged so far are sent
        at once and the state report waits for them."""
        due = self._transition_at
        if due is None:
            return float("inf")
        if due <= now:
            self._transition_at = None
            self._flush_to = self._state_after = self._buffer.end
            self._report = self._steps.report()
            self._state_due = True
        return due

    async def _run(self) -> None:
        me = asyncio.current_task()
        while True:
            if me is not None and me.cancelling():
                # the HTTP client sometimes completes a request and swallows our cancellation
                raise asyncio.CancelledError
            if self._pump_stop.is_set():
                return
            self._wake.clear()
            now = time.monotonic()
            transitions_at = self._transitions_due(now)
            log_at = self._log_due_at(now)
            state_at = now if self._state_due else self._last_state_send + self._cfg.heartbeat_s
            wait = min(log_at, state_at, transitions_at) - now
            if wait > 0:
                try:
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            try:
                if log_at <= now:
                    await self._send_logs()
                if self._state_wanted() and not self._pump_stop.is_set():
                    await self._send_state()
            except Exception as err:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    # the HTTP client turned our cancellation into a "Canceled" error: stop
                    raise asyncio.CancelledError from err
                if not _transient(err):
                    self._fail(err)
                    return
                self._failures += 1
                delay = _backoff(self._failures, self._cfg)
                log.warning("task %d: reporting failed (%s), retrying in %.1fs", self.task_id, err, delay)
                try:
                    async with asyncio.timeout(delay):
                        await self._pump_stop.wait()
                except TimeoutError:
                    pass
            else:
                self._failures = 0

    def _log_due_at(self, now: float) -> float:
        buffer = self._buffer
        if buffer.pending == 0:
            return float("inf")
        if self._flush_to is not None and buffer.acked < self._flush_to:
            return now
        if buffer.pending >= self._cfg.batch_rows or buffer.pending_bytes >= self._cfg.batch_bytes:
            return now
        since = self._unsent_since if self._unsent_since is not None else now
        return min(since + self._cfg.log_max_latency_s, self._last_log_send + self._cfg.log_interval_s)

    def _state_wanted(self) -> bool:
        """Whether a state report goes now. Logs first, for heartbeats too: a report names
        the steps' rows, and one sent before them (the executor killed in between) left a
        finished step in Gitea without its output and the controller's closing lines inside
        it. The rows logged up to the moment the report became due go first, and the report
        carries the steps as they were at that moment (`_report`); later rows do not hold it
        back (a job that never stops printing still gets its heartbeats)."""
        heartbeat = time.monotonic() >= self._last_state_send + self._cfg.heartbeat_s
        if not (heartbeat or self._state_due):
            return False
        if self._state_after is not None:
            if self._buffer.acked < self._state_after:
                return False
            self._state_after = None
            return True
        if self._buffer.acked < self._buffer.end and not self._rows_sent_for_state:
            self._flush_to = self._state_after = self._buffer.end
            self._report = self._steps.report()
            return False
        return True

    async def _send_logs(self, *, no_more: bool = False) -> bool:
        """Send one batch from the ack; true when it carried `no_more` and all rows are acked.

        With `no_more`, the last row travels alone in the final request, after every other
        row was acknowledged: Gitea archives the log on that request whatever it stored, so
        rows lost on the way could never be added afterwards."""
        buffer = self._buffer
        last = buffer.end - 1
        until = last if no_more and buffer.acked < last else None
        index, rows = buffer.batch(self._cfg.batch_rows, self._cfg.batch_bytes, until)
        final = no_more and until is None
        sent_at = time.monotonic()
        ack = await self._call(
            lambda: self._client.update_log(self.task_id, index, rows, no_more=final, retry=NO_RETRY)
        )
        self._apply_ack(ack, index + len(rows))
        self._last_log_send = sent_at
        self._unsent_since = sent_at if self._buffer.pending else None
        self._drained.set()
        if self._flush_to is not None and self._buffer.acked >= self._flush_to:
            self._flush_to = None
        if self._state_after is not None and self._buffer.acked >= self._state_after:
            self._state_after = None
            self._rows_sent_for_state = True
        return final and self._buffer.pending == 0

    def _apply_ack(self, ack: int, sent_end: int) -> None:
        """An ack past what this request carried means Gitea holds rows nobody sent from here
        (Gitea only appends what it is given); ours then continue after them. An ack equal to
        it cannot be told apart from our own rows arriving twice and is taken as such."""
        if ack > sent_end:
            position, shift = self._buffer.rebase(ack)
            self._steps.shift(position, shift)
            log.warning(
                "task %d: Gitea has %d log rows nobody sent from here; continuing after them", self.task_id, shift
            )
        else:
            if ack < self._buffer.acked:
                log.warning(
                    "task %d: Gitea acknowledged row %d, behind %d; resending", self.task_id, ack, self._buffer.acked
                )
            self._buffer.ack(ack, self._clock)

    async def _send_state(self, state: TaskState | None = None) -> None:
        if state is None:
            state = TaskState(id=self.task_id, started_at=self._started_at)
        frozen, self._report = self._report, None
        if frozen is None or state.result != Result.UNSPECIFIED:
            frozen = self._steps.report()
        state.steps, receipt = frozen
        self._rows_sent_for_state = False
        self._state_due = False
        self._last_state_send = time.monotonic()  # transitions meanwhile are spaced from this one
        try:
            answer, outputs = await self._update_task(state)
        except BaseException:
            self._state_due = True
            raise
        self._steps.confirm(receipt)
        self._accepted.took(state)
        self._outputs.confirmed(answer.sent_outputs)
        if any(key not in outputs for key in self._outputs.pending):
            self._state_due = True  # more outputs than one request takes: the next report goes at once
        # The answer to the final report echoes our own result; only a different one is news.
        if answer.result not in (Result.UNSPECIFIED, state.result) and self.server_result == Result.UNSPECIFIED:
            self.server_result = answer.result
            log.info("task %d: Gitea ended the task (%s)", self.task_id, answer.result.name)
            self.cancelled.set()

    def _output_budget(self, steps: int) -> int:
        """Request bytes left for outputs in an UpdateTask carrying `steps` steps."""
        return self._cfg.max_request_bytes - _TASK_BYTES - steps * _STEP_BYTES

    async def _update_task(self, state: TaskState) -> tuple[UpdateTaskResult, dict[str, str]]:
        """One UpdateTask with as many outputs as fit the request size. When a front end
        refuses it as too large anyway, outputs go one per request from then on; one refused
        alone is given up, and the job log says why."""
        while True:
            outputs = self._outputs.batch(self._output_budget(len(state.steps)))
            try:
                answer = await self._call(functools.partial(self._client.update_task, state, outputs, retry=NO_RETRY))
            except RequestTooLarge:
                if not outputs:
                    raise
                self._outputs_refused(outputs)
            else:
                return answer, outputs

    def _outputs_refused(self, outputs: Mapping[str, str]) -> None:
        if len(outputs) > 1:
            self._outputs.per_request = 1
            log.warning(
                "task %d: a report with %d outputs was refused as too large (HTTP 413): one output per report from now",
                self.task_id,
                len(outputs),
            )
            return
        (key,) = outputs
        size = self._outputs.size(key)
        self._outputs.drop(key)
        log.error("task %d: output %r (%d bytes) refused as too large (HTTP 413), not stored", self.task_id, key, size)
        self._note(
            f"##[error]Job output '{key}' was not stored: a proxy in front of Gitea refused the request "
            f"carrying it ({size} bytes) as too large (HTTP 413). Its request body limit (nginx: "
            "client_max_body_size) must be above 1 MiB for outputs this large."
        )

    def _note(self, text: str) -> None:
        """A row of the reporter's own, masked; also while closing, before the closing line."""
        if self._unreported is not None:
            self._unreported.log(text)
            return
        content = cap(self._masker.mask(text))
        self._buffer.append(LogRow(time=self._clock(), content=content), utf8_size(content) + ROW_OVERHEAD)
        if self._unsent_since is None:
            self._unsent_since = time.monotonic()
        self._wake.set()

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        timeout = self._cfg.request_timeout_s
        if self._deadline is not None:
            timeout = max(0.0, min(timeout, self._deadline - time.monotonic()))
        try:
            async with asyncio.timeout(timeout):
                return await fn()
        except TimeoutError as err:
            raise Unavailable(f"no answer within {timeout:g}s") from err

    def _fail(self, err: BaseException) -> None:
        self._drained.set()
        if self.error is None:
            self.error = err
        if not self._end_locally(err):
            log.error("task %d: reporting stopped: %s", self.task_id, err)
        self.cancelled.set()

    def _end_locally(self, err: BaseException) -> bool:
        """When `err` shows Gitea ended the task after the job started reporting, send the
        job's rows to stderr from now on, those Gitea never acknowledged first; returns
        whether it did. (Refused before any report, the credentials may as well be wrong:
        that stays a failure to report.)"""
        if self._unreported is not None:
            return True
        if not self._handshaken or not ends_task(err):
            return False
        out = UnreportedOutput(self.task_id, self._masker, self._cfg.unreported_output)
        self._unreported = out
        if self._closing:
            after = "the job had ended; what Gitea did not take of its log follows here, marked 'not reported'."
        else:
            after = (
                "the job goes on as cancelled (the running step is stopped; if: always() and cancelled() steps "
                "and post stages run), and its output follows here, marked 'not reported'."
            )
        out.say(
            f"task {self.task_id}: Gitea ended the task under the job: {why_ended(err)}. "
            f"Nothing more reaches the job's log: {after}"
        )
        pending = [row.content for row in self._buffer.give_up()]
        if pending and self._closing_row_buffered and not self._cfg.closing_line:
            pending.pop()  # the empty row that only carried no_more
        out.rows(pending)
        return True

    async def _stop_pump(self, deadline: float | None = None) -> None:
        """Stop the pump once the request it has on the wire is answered (or `deadline`
        passed). A request abandoned half-way still runs in Gitea, and Gitea's UpdateLog
        reads the log's length, writes the rows and records the new length without a lock:
        the close's own request at the same index would race it and leave the stored log
        with a hole of NUL bytes (seen on 1.24 and 1.25 with the pump cancelled a few
        milliseconds into its first batch). An UpdateTask left behind would race the final one.
        Without a deadline (nothing follows) the pump is cancelled at once."""
        self._drained.set()
        pump, self._pump = self._pump, None
        if pump is None or pump.done():
            return
        self._pump_stop.set()
        self._wake.set()
        try:
            if deadline is not None:
                await asyncio.wait({pump}, timeout=max(0.0, deadline - time.monotonic()))
        finally:
            if not pump.done():
                pump.cancel()
        try:
            await pump
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise

    # -- start and close ------------------------------------------------------------

    async def _retrying(self, what: str, fn: Callable[[], Awaitable[T]], deadline: float) -> T:
        """`fn` retried on transient errors until `deadline`; the last error is raised."""
        failures = 0
        while True:
            try:
                return await fn()
            except Exception as err:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise asyncio.CancelledError from err  # see _run: a cancelled call is not a failure
                failures += 1
                delay = _backoff(failures, self._cfg)
                if not _transient(err) or time.monotonic() + delay >= deadline:
                    raise
                log.warning("task %d: %s failed (%s), retrying in %.1fs", self.task_id, what, err, delay)
                await asyncio.sleep(delay)

    async def _handshake(self, deadline: float) -> None:
        ack = await self._retrying(
            "reading the log position",
            lambda: self._call(lambda: self._client.update_log(self.task_id, 0, [], retry=NO_RETRY)),
            deadline,
        )
        if ack > 0:
            position, shift = self._buffer.rebase(ack)
            self._steps.shift(position, shift)
        self._handshaken = True

    async def _final_logs(self, closing: str) -> bool:
        """Send every row, then `closing` as a new last row alone with ``no_more``.

        The final request must carry a row Gitea does not have yet: before #37631 it honours
        ``no_more`` only when it appends something, and a row it already holds (its answer
        to an earlier request may have been lost) would be skipped and the log never archived."""
        assert self._deadline is not None
        deadline = self._deadline
        try:
            if not self._handshaken:
                await self._handshake(deadline)
            while self._buffer.pending:
                await self._retrying("sending the log", self._send_logs, deadline)
            await self._send_outputs(deadline)
            while self._buffer.pending:  # what that had to say
                await self._retrying("sending the log", self._send_logs, deadline)
            self._buffer.append(LogRow(time=self._clock(), content=closing), utf8_size(closing) + ROW_OVERHEAD)
            self._closing_row_buffered = True
            done = False
            while not done:
                done = await self._retrying("completing the log", lambda: self._send_logs(no_more=True), deadline)
            return True
        except Exception as err:
            if self.error is None:
                self.error = err
            if not self._end_locally(err):
                log.error("task %d: could not complete the log: %s", self.task_id, err)
            return False

    async def _send_outputs(self, deadline: float) -> None:
        """Outputs still pending go before the log is completed, in as many reports as they
        need: the final report ends the task (and deletes the runner), so nothing can follow
        it, and an output a proxy refuses can still be explained in the log. What Gitea does
        not store here is tried once more with the final report."""
        while pending := self._outputs.pending:
            await self._retrying("sending outputs", self._send_state, deadline)
            if self._outputs.pending == pending:
                return

    async def _final_state(self, state: TaskState) -> bool:
        assert self._deadline is not None
        maybe_delivered = False

        async def attempt() -> None:
            nonlocal maybe_delivered
            try:
                await self._send_state(state)
            except Exception as err:
                if _transient(err):
                    maybe_delivered = True
                raise

        try:
            await self._retrying("finalizing the task", attempt, self._deadline)
        except Unauthenticated as err:
            if maybe_delivered:
                # An earlier attempt reached Gitea, which then deleted the ephemeral runner.
                log.info("task %d: finalized by an earlier attempt (runner now removed)", self.task_id)
                return True
            if self._end_locally(err):
                return True  # Gitea ended the task as its log was completed
            self._note_error(err)
            return False
        except Exception as err:
            self._note_error(err)
            return False
        return True

    def _note_error(self, err: BaseException) -> None:
        log.error("task %d: could not finalize the task: %s", self.task_id, err)
        if self.error is None:
            self.error = err


def _transient(err: BaseException) -> bool:
    return isinstance(err, GiteaError) and err.transient


def _backoff(failures: int, cfg: ReporterConfig) -> float:
    delay: float = min(cfg.retry_max_s, cfg.retry_initial_s * 2 ** min(failures - 1, 16))
    return delay * random.uniform(0.5, 1.0)
