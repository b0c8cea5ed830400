"""LogBuffer: absolute indexes, batches within limits, acks that move both ways."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dynrunner.executor.reporter.logbuffer import LOST_ROW, LogBuffer
from dynrunner.proto.gitea import LogRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def now() -> datetime:
    return T0


def filled(n: int, size: int = 10, **kw: int) -> LogBuffer:
    buf = LogBuffer(**kw)
    for i in range(n):
        assert buf.append(LogRow(T0, f"r{i}"), size) == i
    return buf


def test_batches_respect_rows_and_bytes() -> None:
    buf = filled(10)
    assert buf.batch(4, 10_000) == (0, [LogRow(T0, f"r{i}") for i in range(4)])
    assert len(buf.batch(100, 35)[1]) == 3
    assert len(buf.batch(100, 5)[1]) == 1  # a row bigger than the limit still goes alone


def test_ack_moves_forward_and_tracks_pending_bytes() -> None:
    buf = filled(10)
    assert (buf.pending, buf.pending_bytes) == (10, 100)
    buf.ack(4, now)
    assert (buf.acked, buf.pending, buf.pending_bytes) == (4, 6, 60)
    assert buf.batch(2, 1000) == (4, [LogRow(T0, "r4"), LogRow(T0, "r5")])


def test_lower_ack_resends_from_there() -> None:
    buf = filled(10)
    buf.ack(8, now)
    buf.ack(5, now)  # the server lost three rows it had acknowledged
    assert (buf.acked, buf.pending, buf.pending_bytes) == (5, 5, 50)
    assert buf.batch(100, 1000)[1][0].content == "r5"


def test_acked_rows_beyond_the_retention_are_dropped_and_refilled_if_lost() -> None:
    buf = filled(10, retain_acked=3)
    buf.ack(10, now)
    assert buf.base == 7
    buf.ack(2, now)
    assert buf.base == 2
    index, rows = buf.batch(100, 10_000)
    assert index == 2
    assert [r.content for r in rows] == [LOST_ROW] * 5 + ["r7", "r8", "r9"]
    assert buf.end == 10


def test_ack_beyond_our_rows_needs_a_rebase() -> None:
    buf = filled(5)
    buf.ack(2, now)
    with pytest.raises(ValueError, match="rebase"):
        buf.ack(9, now)
    assert buf.rebase(9) == (2, 7)
    assert (buf.acked, buf.end, buf.pending) == (9, 12, 3)
    assert buf.batch(10, 1000) == (9, [LogRow(T0, "r2"), LogRow(T0, "r3"), LogRow(T0, "r4")])


def test_compaction_keeps_indexes() -> None:
    buf = filled(20_000, retain_acked=0)
    buf.ack(15_000, now)
    assert buf.row(15_000).content == "r15000"
    assert buf.batch(1, 100) == (15_000, [LogRow(T0, "r15000")])
    assert buf.end == 20_000
