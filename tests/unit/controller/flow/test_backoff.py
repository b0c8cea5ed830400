"""Backoff with jitter (pure) and the supervision of loops."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

from dynrunner.controller.launcher import nak_delay
from dynrunner.controller.loops import Backoff, Fatal, PollPacer, supervise


def test_backoff_doubles_up_to_the_cap_within_the_jitter() -> None:
    b = Backoff(initial=1.0, maximum=5.0, jitter=0.2, rng=random.Random(7))
    delays = [b.next() for _ in range(6)]
    for delay, center in zip(delays, [1, 2, 4, 5, 5, 5], strict=True):
        assert center * 0.8 <= delay <= center * 1.2
    b.reset()
    assert 0.8 <= b.next() <= 1.2


def test_backoff_without_jitter_is_exact() -> None:
    b = Backoff(initial=0.5, maximum=3.0, jitter=0.0)
    assert [b.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_spreads_pollers() -> None:
    rng = random.Random(1)
    delays = {round(Backoff(1.0, 8.0, rng=rng).next(), 6) for _ in range(20)}
    assert len(delays) > 10


def test_nak_delay_grows_per_delivery() -> None:
    assert [nak_delay(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert nak_delay(20) == 60.0


async def test_supervise_restarts_after_errors_and_stops_on_return() -> None:
    calls = []
    errors: list[BaseException] = []

    async def body() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("boom")

    await supervise("t", body, backoff=Backoff(0.001, 0.002), on_error=errors.append)
    assert len(calls) == 3
    assert [str(e) for e in errors] == ["boom", "boom"]


async def test_supervise_lets_fatal_errors_through() -> None:
    async def body() -> None:
        raise Fatal("no")

    with pytest.raises(Fatal):
        await supervise("t", body, backoff=Backoff(0.001, 0.002))


async def test_supervise_is_cancellable_while_backing_off() -> None:
    async def body() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(supervise("t", body, backoff=Backoff(10, 10)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_the_loops_of_a_pool_take_turns_when_nothing_is_found() -> None:
    """Two loops that keep finding nothing poll one step apart, pool-wide, not each on its own."""
    pacer = PollPacer(Backoff(initial=0.5, maximum=1.0, jitter=0.0))
    polls = []
    wake = {"a": 0.0, "b": 0.0}
    for _ in range(8):
        loop, now = min(wake.items(), key=lambda item: item[1])
        polls.append(now)
        wake[loop] = now + pacer.delay(now)
    assert [round(b - a, 6) for a, b in itertools.pairwise(polls[1:])] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_a_claim_makes_the_next_empty_answer_wait_the_shortest_step() -> None:
    pacer = PollPacer(Backoff(initial=0.5, maximum=4.0, jitter=0.0))
    for _ in range(5):
        pacer.delay(0.0)
    pacer.claimed()
    assert pacer.delay(100.0) == 0.5
    assert pacer.delay(100.0) == 0.5 + 1.0  # the other loop takes the slot after
