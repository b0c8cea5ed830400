"""Gitea's Actions status values and the pure rules built on them.

Numbers match Gitea's `models/actions/status.go` (they are stored in the database and
`TaskNeed.result` is the status number cast to `runner.v1.Result`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class Status(enum.IntEnum):
    UNKNOWN = 0
    SUCCESS = 1
    FAILURE = 2
    CANCELLED = 3
    SKIPPED = 4
    WAITING = 5
    RUNNING = 6
    BLOCKED = 7
    CANCELLING = 8

    @property
    def word(self) -> str:
        return self.name.lower()

    def is_done(self) -> bool:
        return self in _DONE

    def as_result(self) -> int:
        """`Status.AsResult`: the runner.v1.Result a task in this status reports."""
        if self is Status.CANCELLING:
            return int(Status.CANCELLED)
        return int(self) if self in _DONE else 0

    @classmethod
    def from_result(cls, result: int) -> Status:
        """`StatusFromResult`: UNSPECIFIED and unknown numbers give UNKNOWN."""
        return cls(result) if result in (1, 2, 3, 4) else cls.UNKNOWN


_DONE = frozenset({Status.SUCCESS, Status.FAILURE, Status.CANCELLED, Status.SKIPPED})


@dataclass(frozen=True, slots=True)
class JobState:
    """What aggregation needs of a job."""

    status: Status
    continue_on_error: bool = False


def aggregate_job_status(jobs: Iterable[JobState]) -> Status:
    """`AggregateJobStatus`: a run's (or a matrix group's) status from its jobs' statuses."""
    jobs = list(jobs)
    all_success_or_skipped = bool(jobs)
    all_skipped = bool(jobs)
    has = {s: False for s in Status}
    has_failure = False
    for job in jobs:
        continued_failure = job.continue_on_error and job.status is Status.FAILURE
        all_success_or_skipped = all_success_or_skipped and (
            job.status in (Status.SUCCESS, Status.SKIPPED) or continued_failure
        )
        all_skipped = all_skipped and job.status is Status.SKIPPED
        has_failure = has_failure or (job.status is Status.FAILURE and not job.continue_on_error)
        has[job.status] = True
    if all_skipped:
        return Status.SKIPPED
    if all_success_or_skipped:
        return Status.SUCCESS
    for status in (Status.CANCELLING, Status.RUNNING, Status.WAITING, Status.BLOCKED, Status.CANCELLED):
        if has[status]:
            return status
    if has_failure:
        return Status.FAILURE
    return Status.UNKNOWN
