"""Backoff with jitter, poll pacing, stop flags and supervision for the controller's loops.

Every background task of the controller runs under `supervise`: an unexpected error is
logged and counted, and the loop restarts after a backoff; a `Fatal` error stops the whole
controller (the TaskGroup cancels its siblings), because retrying cannot fix it.

Every loop also stops on a flag (`Stopping`), not only on cancel: on Python 3.11
`asyncio.wait_for`, which nats-py's requests use, can swallow a cancellation that arrives
with the answer, and a loop that relied on the cancel would go on with that answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class Fatal(Exception):
    """An error no retry can fix (e.g. a Gitea too old for ephemeral runners)."""


class Stopped(Exception):
    """The stop flag a wait was given is set: the waiting loop ends without a cancellation."""


class Stopping(asyncio.Event):
    """A loop's stop flag: checked at every turn of the loop, and waited on wherever the loop
    would sleep or wait for something other than an answer. A cancellation swallowed by a
    request in flight then costs the rest of that request, never the stop."""

    async def sleep(self, seconds: float) -> bool:
        """Wait `seconds`, or until the flag is set; True when it is set."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait(), seconds)
        return self.is_set()

    async def wait_on(self, event: asyncio.Event, timeout_s: float) -> None:
        """Wait up to `timeout_s` for `event`; raise `Stopped` once the flag is set. For a wait
        inside a loop's turn (a lease to be held, a permit to come free): a cancellation lost
        before it would otherwise leave that wait to go on for good."""
        if self.is_set():
            raise Stopped
        if not event.is_set():
            waits = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(self.wait())}
            try:
                await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        if self.is_set():
            raise Stopped


@dataclass
class Backoff:
    """Exponential backoff with ±`jitter` proportional randomness, capped at `maximum`.

    `next()` gives the delay before the next attempt and advances; `reset()` after success.
    The first delay after a reset is `initial`, so an idle poller's first wait is short.
    Any number of attempts is fine: the power `factor**attempts` is never formed past the
    attempt that reaches `maximum` (an idle poller counts one attempt per empty answer, and
    `2.0**1024` overflows), and `attempts` stops growing there.
    """

    initial: float
    maximum: float
    factor: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random, repr=False)
    attempts: int = 0

    def __post_init__(self) -> None:
        valid = (
            0 <= self.initial < math.inf
            and 0 <= self.maximum < math.inf
            and 1 <= self.factor < math.inf
            and 0 <= self.jitter <= 1
        )
        if valid and self.initial > 0:
            # The largest power formed is about factor² · maximum / initial: it must be a float.
            valid = math.isfinite(self.maximum / self.initial * self.factor * self.factor)
        if not valid:
            raise ValueError(
                f"invalid backoff: initial={self.initial}, maximum={self.maximum}, factor={self.factor}, "
                f"jitter={self.jitter} (need finite 0 ≤ initial, 0 ≤ maximum, 1 ≤ factor, 0 ≤ jitter ≤ 1, "
                "and maximum / initial · factor² a finite number)"
            )

    @property
    def saturation(self) -> int:
        """The number of attempts from which the delay is `maximum` (further attempts change nothing)."""
        if self.initial == 0 or self.factor == 1 or self.initial >= self.maximum:
            return 0
        # One more than the rounded-up logarithm, so float rounding never stops short of the cap.
        return math.ceil(math.log(self.maximum / self.initial) / math.log(self.factor)) + 1

    def peek(self) -> float:
        """The un-jittered delay `next()` would center on: initial·factor^attempts, capped."""
        return min(self.maximum, self.initial * self.factor ** min(self.attempts, self.saturation))

    def next(self) -> float:
        base = self.peek()
        self.attempts = min(self.attempts, self.saturation) + 1
        spread = base * self.jitter
        return max(0.0, base + self.rng.uniform(-spread, spread))

    def reset(self) -> None:
        self.attempts = 0


class PollPacer:
    """Spaces the polls of one pool's claim loops after empty answers (and errors), so the pool
    as a whole polls once per backoff step however many loops it runs.

    The step starts at `backoff.initial` after a claim and grows while nothing is found, up to
    `backoff.maximum`. Each loop that found nothing takes the pool's next free slot, one step
    after the last one handed out: n loops cost an idle Gitea what one loop costs, and a job
    that starts waiting is picked up within about one step (not within the step of whichever
    loop happens to poll next).
    """

    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self._last = -math.inf
        self.claims = 0
        """Claims of the pool's loops so far (a loop tells from it that a sibling claimed)."""

    def claimed(self) -> None:
        """A poll returned a task: the next empty answer waits the shortest step again."""
        self._backoff.reset()
        self._last = -math.inf
        self.claims += 1

    def delay(self, now: float) -> float:
        """Seconds a loop whose poll found nothing (or failed) at `now` waits before the next."""
        at = max(now, self._last) + self._backoff.next()
        self._last = at
        return at - now


async def supervise(
    name: str,
    body: Callable[[], Awaitable[None]],
    *,
    backoff: Backoff | None = None,
    on_error: Callable[[BaseException], None] | None = None,
    healthy_after_s: float | None = None,
    stop: asyncio.Event | None = None,
    on_fatal: Callable[[], None] | None = None,
) -> None:
    """Run `body` until it returns; restart it after unexpected errors.

    The wait before a restart grows while runs keep failing quickly, up to `backoff.maximum`,
    and starts over from `backoff.initial` after a run that lasted `healthy_after_s` (default:
    the longest wait): a loop that fails once a day is restarted at once, a loop that fails at
    every start is not restarted in a tight loop, and neither ever stops being restarted.
    `stop` set during a wait ends the supervision instead (a shutdown does not sit out the
    backoff of a failing loop).
    """
    backoff = backoff or Backoff(initial=0.5, maximum=30.0)
    healthy = backoff.maximum if healthy_after_s is None else healthy_after_s
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        try:
            await body()
            return
        except asyncio.CancelledError:
            raise
        except Fatal:
            if on_fatal is not None:
                on_fatal()
            raise
        except Exception as err:
            if on_error is not None:
                on_error(err)
            if loop.time() - started >= healthy:
                backoff.reset()
            delay = backoff.next()
            log.exception("%s failed; restarting in %.1fs", name, delay)
            if stop is None:
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    log.info("%s: not restarted (stopping)", name)
                    return
