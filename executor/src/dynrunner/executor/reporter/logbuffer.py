"""The rows of one task's log, addressed by absolute row index, kept until Gitea has them.

Gitea's UpdateLog takes rows starting at an absolute `index` and answers `ack_index`, the
number of rows it has stored. It appends ``rows[ack - index:]`` only when
``index <= ack < index + len(rows)``; otherwise it writes nothing and answers its own ack,
lower when we were ahead of it. Rows are sent from our last ack, and every answer moves
that position, down as well as up; a window of already acknowledged rows is retained so a
server that loses rows after acknowledging them can be given them again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from dynrunner.proto.gitea import LogRow

# Wire overhead of one row beyond its content (field tags, lengths, timestamp).
ROW_OVERHEAD = 20
LOST_ROW = "[dynrunner: this log row was lost by the server after it had acknowledged it]"


class LogBuffer:
    """Rows ``[base, end)`` held locally; ``[acked, end)`` not yet confirmed by Gitea."""

    def __init__(self, *, retain_acked: int = 10_000) -> None:
        self._rows: list[LogRow] = []
        self._sizes: list[int] = []
        self._head = 0  # list position of absolute row `base`
        self.base = 0
        self.acked = 0
        self.end = 0  # the absolute index the next appended row gets
        self.pending_bytes = 0
        self._retain = retain_acked

    @property
    def pending(self) -> int:
        """Rows not yet acknowledged."""
        return self.end - self.acked

    def append(self, row: LogRow, size: int) -> int:
        self._rows.append(row)
        self._sizes.append(size)
        self.pending_bytes += size
        self.end += 1
        return self.end - 1

    def extend(self, rows: list[LogRow], sizes: list[int]) -> int:
        """Append `rows` (with their wire sizes); returns the index of the last one."""
        self._rows += rows
        self._sizes += sizes
        self.pending_bytes += sum(sizes)
        self.end += len(rows)
        return self.end - 1

    def row(self, index: int) -> LogRow:
        return self._rows[self._head + index - self.base]

    def batch(self, max_rows: int, max_bytes: int, until: int | None = None) -> tuple[int, list[LogRow]]:
        """Unacknowledged rows from `acked` (and before `until`), as many as fit, at least one."""
        start = self._head + self.acked - self.base
        stop = min(len(self._rows), start + max_rows)
        if until is not None:
            stop = min(stop, self._head + until - self.base)
        total = 0
        for pos in range(start, stop):
            total += self._sizes[pos]
            if total > max_bytes and pos > start:
                stop = pos
                break
        return self.acked, self._rows[start:stop]

    def give_up(self) -> list[LogRow]:
        """The rows not acknowledged yet, which will never be: they count as acknowledged."""
        start = self._head + self.acked - self.base
        rows = self._rows[start:]
        self.pending_bytes = 0
        self.acked = self.end
        self._trim()
        return rows

    def ack(self, ack: int, placeholder_time: Callable[[], datetime]) -> None:
        """Apply the server's ack. `ack` must be ≤ `end` (see `rebase` for the other case).

        Below `base` (rows we no longer hold) the gap is refilled with placeholder rows so
        every later absolute index, and every step range, stays true."""
        if ack > self.end:
            raise ValueError(f"ack {ack} beyond the last row {self.end}; rebase first")
        if ack < self.base:
            self._refill(ack, placeholder_time())
        if ack >= self.acked:
            self.pending_bytes -= self._size_between(self.acked, ack)
        else:
            self.pending_bytes += self._size_between(ack, self.acked)
        self.acked = ack
        self._trim()

    def rebase(self, ack: int) -> tuple[int, int]:
        """The server holds rows we never sent (someone else wrote to this log): move our
        unacknowledged rows so they follow the server's rows. Returns (position, shift)."""
        position, shift = self.acked, ack - self.acked
        if shift <= 0:
            return position, 0
        # The retained acknowledged rows cannot stay contiguous with the moved ones: drop them.
        held = self.acked - self.base
        if held:
            del self._rows[self._head : self._head + held]
            del self._sizes[self._head : self._head + held]
        self.base = ack
        self.acked = ack
        self.end += shift
        return position, shift

    def _size_between(self, lo: int, hi: int) -> int:
        return sum(self._sizes[self._head + lo - self.base : self._head + hi - self.base])

    def _refill(self, ack: int, time: datetime) -> None:
        missing = self.base - ack
        self._compact()
        self._rows[0:0] = [LogRow(time=time, content=LOST_ROW)] * missing
        self._sizes[0:0] = [len(LOST_ROW) + ROW_OVERHEAD] * missing
        self.base = ack

    def _trim(self) -> None:
        surplus = self.acked - self.base - self._retain
        if surplus > 0:
            self._head += surplus
            self.base += surplus
        if self._head > 4096 and self._head * 2 > len(self._rows):
            self._compact()

    def _compact(self) -> None:
        if self._head:
            del self._rows[: self._head]
            del self._sizes[: self._head]
            self._head = 0
