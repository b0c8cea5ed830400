"""One delivery of an assignment to a launcher, and what the launcher can answer.

Every answer (ack, nak, term) waits for the server's confirmation, so what the launcher does
next (release capacity, finalize the task, report) sees the stream in its new state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from dynrunner.proto.assignment import SealedAssignment

__all__ = ["Delivery"]

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT_S = 5.0


@dataclass(slots=True)
class Delivery:
    """One delivery of an assignment to a launcher. `assignment` is still sealed (and not yet
    authenticated)."""

    assignment: SealedAssignment
    num_delivered: int
    max_deliver: int
    stream_seq: int
    _msg: Msg = field(repr=False)
    _nc: Client = field(repr=False)
    _ack_wait_s: float = field(repr=False)

    @property
    def is_redelivery(self) -> bool:
        return self.num_delivered > 1

    @property
    def is_last_attempt(self) -> bool:
        """This is attempt `max_deliver` (or later): if it fails, finalize the task failed."""
        return self.num_delivered >= self.max_deliver

    @property
    def exhausted(self) -> bool:
        """Every allowed attempt was made already (the last one's handler died): do not launch,
        finalize the task failed and `term()`."""
        return self.num_delivered > self.max_deliver

    async def in_progress(self) -> None:
        """Restart the ack-wait clock (during a slow launch)."""
        await self._msg.in_progress()

    @contextlib.asynccontextmanager
    async def keep_alive(self, interval_s: float | None = None) -> AsyncIterator[None]:
        """Send `in_progress()` every third of ack-wait while the block runs."""
        period = interval_s if interval_s is not None else max(self._ack_wait_s / 3, 0.05)

        async def beat() -> None:
            while True:
                await asyncio.sleep(period)
                try:
                    await self._msg.in_progress()
                except nats.errors.Error as err:
                    log.warning("in-progress ack failed: %s", err or type(err).__name__)

        task = asyncio.create_task(beat(), name=f"keep-alive {self.assignment.assignment_id}")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def ack(self) -> None:
        """Done: the message leaves the stream."""
        await self._confirm(Msg.Ack.Ack)

    async def nak(self, delay_s: float | None = None) -> None:
        """Failed this time: deliver again (after `delay_s`)."""
        payload = Msg.Ack.Nak
        if delay_s:
            payload += b" " + json.dumps({"delay": int(delay_s * 1e9)}).encode()
        await self._confirm(payload)

    async def term(self) -> None:
        """Never deliver again (the task was finalized, or the message can never be used); the
        message leaves the stream."""
        await self._confirm(Msg.Ack.Term)

    async def _confirm(self, payload: bytes) -> None:
        await self._nc.request(self._msg.reply, payload, timeout=CONFIRM_TIMEOUT_S)
