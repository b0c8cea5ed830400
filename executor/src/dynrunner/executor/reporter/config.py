"""How often and how much the reporter sends; all knobs in one frozen value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dynrunner.executor.reporter.unreported import to_stderr
from dynrunner.proto.gitea.client import MAX_REQUEST_BYTES


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ReporterConfig:
    """Defaults suit one executor per job talking to one Gitea.

    Logs are sent when a batch is full (`batch_rows` or `batch_bytes`), when the oldest
    unsent row has waited `log_max_latency_s`, or `log_interval_s` after the previous send,
    whichever comes first. act_runner waits up to 5 s; one executor per job can afford
    faster feedback, while every request still costs Gitea a PBKDF2 check of the runner
    token, so the default stays at one per second.

    A step start or end is reported within `transition_window_s`: the rows so far, then the
    state of every step. Transitions within that window share one UpdateLog and one
    UpdateTask, so a job of many short steps costs a few requests, not four per step.

    Gitea rewrites every step row of the task on each UpdateTask, whatever the request
    carries, and every step that started must be in each (see `steps`): so reports of a job
    of N steps are at least N × `state_spacing_per_step_s` apart (at most `heartbeat_s`):
    the transition window alone up to 1,000 steps, 2 s for 20,000.

    `heartbeat_s` keeps UpdateTask at most this far apart even when nothing changed, so
    Gitea never takes a quiet job for a zombie and a cancellation is seen within it.
    `batch_bytes` stays well below the 1 MiB request limit of common reverse proxies; a
    single row (at most 64 KiB) always fits.

    `max_request_bytes` bounds each request's body where it can be split, for front ends
    that limit bodies (nginx: 1 MiB by default): outputs are spread over as many UpdateTasks
    as needed (one over it alone goes compressed, see `GiteaClient`), and `batch_bytes` plus
    one row of 64 KiB stays well under it.

    `max_backlog_bytes` bounds what `Reporter.throttle` lets pile up unacknowledged before
    it makes the engine wait (rows take about three times their size in memory: 4 MiB of
    backlog is about 12 MB).

    `unreported_output` takes the job's rows once Gitea has ended the task under the job
    (see `unreported`): the executor's stderr.
    """

    log_interval_s: float = 1.0
    log_max_latency_s: float = 1.0
    batch_rows: int = 5000
    batch_bytes: int = 512 * 1024
    transition_window_s: float = 0.1
    state_spacing_per_step_s: float = 0.0001
    heartbeat_s: float = 4.0
    request_timeout_s: float = 30.0
    retry_initial_s: float = 0.5
    retry_max_s: float = 10.0
    start_timeout_s: float = 120.0
    close_timeout_s: float = 60.0
    retain_acked_rows: int = 10_000
    max_backlog_bytes: int = 4 * 1024 * 1024
    max_request_bytes: int = MAX_REQUEST_BYTES
    closing_line: bool = True
    clock: Callable[[], datetime] = field(default=utc_now)
    unreported_output: Callable[[str], None] = field(default=to_stderr)
    state_file: str | None = None
    """Where to keep the task state Gitea last accepted, for the controller (`accepted`)."""
    termination_message: str | None = None
    """Where to keep it as the container's termination message too (a Pod, `accepted`)."""
