"""Pure rules of the Gitea double: the job emitter, status aggregation, tokens, log rows."""

from __future__ import annotations

import json
import re

import pytest

from dynrunner.doubles.gitea.logs import format_row
from dynrunner.doubles.gitea.runs import resolve_blocked
from dynrunner.doubles.gitea.status import JobState, Status, aggregate_job_status
from dynrunner.doubles.gitea.tokens import (
    decode_runtime_token,
    hash_token,
    new_salted_token,
    runtime_token,
    token_matches,
)

S = Status


def jobs(*specs: tuple[int, str, Status, list[str], bool]) -> list[dict[str, object]]:
    return [{"id": i, "job_id": k, "status": s, "needs": n, "has_if": f} for i, k, s, n, f in specs]


def test_a_blocked_job_waits_for_all_needs() -> None:
    graph = jobs((1, "a", S.SUCCESS, [], False), (2, "b", S.RUNNING, [], False), (3, "c", S.BLOCKED, ["a", "b"], False))
    assert resolve_blocked(graph) == {}
    graph[1]["status"] = S.SUCCESS
    assert resolve_blocked(graph) == {3: S.WAITING}


@pytest.mark.parametrize("failed", [S.FAILURE, S.CANCELLED, S.SKIPPED])
def test_a_need_that_did_not_succeed_skips_jobs_without_if(failed: Status) -> None:
    graph = jobs((1, "a", failed, [], False), (2, "b", S.BLOCKED, ["a"], False), (3, "c", S.BLOCKED, ["a"], True))
    assert resolve_blocked(graph) == {2: S.SKIPPED, 3: S.WAITING}


def test_skips_cascade_until_a_job_with_if() -> None:
    graph = jobs(
        (1, "a", S.FAILURE, [], False),
        (2, "b", S.BLOCKED, ["a"], False),
        (3, "c", S.BLOCKED, ["b"], False),
        (4, "d", S.BLOCKED, ["c"], True),
        (5, "e", S.BLOCKED, ["d"], False),
    )
    assert resolve_blocked(graph) == {2: S.SKIPPED, 3: S.SKIPPED, 4: S.WAITING}


def test_matrix_siblings_share_a_job_id() -> None:
    graph = jobs((1, "m", S.SUCCESS, [], False), (2, "m", S.FAILURE, [], False), (3, "n", S.BLOCKED, ["m"], False))
    assert resolve_blocked(graph) == {3: S.SKIPPED}


def test_a_need_on_a_missing_job_is_vacuously_done() -> None:
    assert resolve_blocked(jobs((1, "a", S.BLOCKED, ["gone"], False))) == {1: S.WAITING}


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([], S.UNKNOWN),
        ([S.SUCCESS, S.SKIPPED], S.SUCCESS),
        ([S.SKIPPED, S.SKIPPED], S.SKIPPED),
        ([S.SUCCESS, S.FAILURE], S.FAILURE),
        ([S.FAILURE, S.CANCELLED], S.CANCELLED),
        ([S.FAILURE, S.WAITING], S.WAITING),
        ([S.FAILURE, S.BLOCKED], S.BLOCKED),
        ([S.WAITING, S.RUNNING], S.RUNNING),
        ([S.RUNNING, S.CANCELLING], S.CANCELLING),
    ],
)
def test_aggregate_job_status(statuses: list[Status], expected: Status) -> None:
    assert aggregate_job_status(JobState(s) for s in statuses) is expected


def test_a_continued_failure_counts_as_success() -> None:
    assert aggregate_job_status([JobState(S.FAILURE, True), JobState(S.SUCCESS)]) is S.SUCCESS


@pytest.mark.parametrize(
    ("status", "result"),
    [
        (S.SUCCESS, 1),
        (S.FAILURE, 2),
        (S.CANCELLED, 3),
        (S.SKIPPED, 4),
        (S.CANCELLING, 3),
        (S.RUNNING, 0),
        (S.WAITING, 0),
    ],
)
def test_as_result(status: Status, result: int) -> None:
    assert status.as_result() == result


def test_salted_tokens_hash_like_gitea() -> None:
    token = new_salted_token(100)
    assert re.fullmatch(r"[0-9a-f]{40}", token.token) and len(token.salt) == 10
    assert token.hash == hash_token(token.token, token.salt, 100) and len(token.hash) == 100
    assert token_matches(token.token, token.salt, token.hash, 100)
    assert not token_matches(token.token, token.salt, token.hash, 101)
    assert not token_matches("0" * 40, token.salt, token.hash, 100)


def test_the_runtime_token_round_trips_and_detects_tampering() -> None:
    token = runtime_token(b"k" * 32, task_id=7, run_id=3, job_id=5, now=1_000)
    claims = decode_runtime_token(token, b"k" * 32)
    assert list(claims) == ["exp", "nbf", "scp", "TaskID", "RunID", "JobID", "ac"]
    assert claims == {
        "exp": 1_000 + 4 * 3600,
        "nbf": 1_000,
        "scp": "Actions.Results:3:5",
        "TaskID": 7,
        "RunID": 3,
        "JobID": 5,
        "ac": json.dumps([{"Scope": "", "Permission": 2}], separators=(",", ":")),
    }
    with pytest.raises(ValueError, match="signature"):
        decode_runtime_token(token, b"x" * 32)


def test_log_rows_use_giteas_format() -> None:
    assert format_row(0, 5_000, "a\nb") == b"1970-01-01T00:00:00.0000050Z a\\nb"
    long = format_row(1, 0, "é" * 40_000)
    assert len(long) == len(b"1970-01-01T00:00:01.0000000Z ") + 65_536
