"""Backoff with jitter, poll pacing and supervision for the controller's long-running loops.

Every background task of the controller runs under `supervise`: an unexpected error is
logged and counted, and the loop restarts after a backoff; a `Fatal` error stops the whole
controller (the TaskGroup cancels its siblings), because retrying cannot fix it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class Fatal(Exception):
    """An error no retry can fix (e.g. a Gitea too old for ephemeral runners)."""


@dataclass
class Backoff:
    """Exponential backoff with ±`jitter` proportional randomness, capped at `maximum`.

    `next()` gives the delay before the next attempt and advances; `reset()` after success.
    The first delay after a reset is `initial`, so an idle poller's first wait is short.
    """

    initial: float
    maximum: float
    factor: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random, repr=False)
    attempts: int = 0

    def peek(self) -> float:
        """The un-jittered delay `next()` would center on."""
        return min(self.maximum, self.initial * self.factor**self.attempts)

    def next(self) -> float:
        base = self.peek()
        self.attempts += 1
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

    def claimed(self) -> None:
        """A poll returned a task: the next empty answer waits the shortest step again."""
        self._backoff.reset()
        self._last = -math.inf

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
) -> None:
    """Run `body` until it returns; restart it after unexpected errors (with backoff, reset
    once a run lasted longer than the longest delay)."""
    backoff = backoff or Backoff(initial=0.5, maximum=30.0)
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        try:
            await body()
            return
        except (asyncio.CancelledError, Fatal):
            raise
        except Exception as err:
            if on_error is not None:
                on_error(err)
            if loop.time() - started > backoff.maximum:
                backoff.reset()
            delay = backoff.next()
            log.exception("%s failed; restarting in %.1fs", name, delay)
            await asyncio.sleep(delay)
