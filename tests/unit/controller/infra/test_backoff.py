"""Backoff with jitter (pure) and the supervision of loops (on virtual time for days of it)."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynrunner.controller.app import claim_loop_backoff
from dynrunner.controller.claiming.claimer import slow_answer_delay
from dynrunner.controller.infra.loops import Backoff, Fatal, PollPacer, supervise
from dynrunner.controller.launching.launcher import nak_delay
from tests.fixtures.virtual_time import virtual_time


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


# -- any number of attempts (an idle poller counts one per empty answer) ---------------------

backoffs = st.builds(
    Backoff,
    initial=st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=3600.0)),
    maximum=st.floats(min_value=0.0, max_value=86400.0),
    factor=st.floats(min_value=1.0, max_value=10.0),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    rng=st.randoms(use_true_random=False),
)


@given(backoff=backoffs, attempts=st.integers(min_value=0, max_value=10**40))
def test_backoff_gives_a_capped_delay_for_any_number_of_attempts(backoff: Backoff, attempts: int) -> None:
    backoff.attempts = attempts
    base = backoff.peek()
    assert math.isfinite(base)
    assert min(backoff.initial, backoff.maximum) <= base <= backoff.maximum
    # What the uncapped formula gives wherever it can be computed (Fractions never overflow).
    if attempts <= 2000:
        exact = Fraction(backoff.initial) * Fraction(backoff.factor) ** attempts
        assert base == pytest.approx(float(min(Fraction(backoff.maximum), exact)), rel=1e-9)
    delay = backoff.next()
    assert max(0.0, base * (1 - backoff.jitter)) - 1e-9 <= delay <= base * (1 + backoff.jitter) + 1e-9
    assert backoff.attempts <= backoff.saturation + 1  # the counter stops growing at the cap


@given(backoff=backoffs, steps=st.integers(min_value=1, max_value=300))
def test_backoff_grows_monotonically_to_the_cap_and_stays_there(backoff: Backoff, steps: int) -> None:
    centers = []
    for _ in range(steps):
        centers.append(backoff.peek())
        backoff.next()
    assert centers == sorted(centers)
    if steps > backoff.saturation:
        assert backoff.peek() == (backoff.maximum if backoff.saturation else min(backoff.initial, backoff.maximum))


def test_an_idle_pollers_backoff_outlives_2_to_the_1024() -> None:
    """The crash of issue 14: 1,024 empty polls made `2.0**1024` and an OverflowError."""
    b = Backoff(initial=0.5, maximum=1.0)
    delays = [b.next() for _ in range(100_000)]
    assert max(delays) <= 1.2
    assert b.attempts == b.saturation + 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": -1.0, "maximum": 1.0},
        {"initial": 1.0, "maximum": math.inf},
        {"initial": 1.0, "maximum": 1.0, "factor": 0.5},
        {"initial": 1.0, "maximum": 1.0, "jitter": 1.5},
        {"initial": 1e-300, "maximum": 1e300},
    ],
)
def test_a_backoff_that_could_overflow_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="invalid backoff"):
        Backoff(**kwargs)


def test_nak_delay_of_any_delivery_count() -> None:
    assert nak_delay(10**6) == 60.0


# -- supervision over days, on virtual time ---------------------------------------------------


def test_supervise_keeps_restarting_a_loop_that_fails_at_once_for_days() -> None:
    """Each run fails at once, so the backoff is never reset by a long run: it must stay capped
    and never overflow (before the fix the 1,024th restart raised OverflowError and the
    controller exited)."""
    runs: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        async def body() -> None:
            runs.append(loop.time())
            if loop.time() > 48 * 3600:
                return
            raise RuntimeError("fails at every start")

        await supervise("failing", body, backoff=claim_loop_backoff())

    with virtual_time() as runner:
        runner.run(scenario())
    gaps = [b - a for a, b in itertools.pairwise(runs)]
    assert len(runs) > 2800  # ≈ one restart a minute for 48 h
    assert max(gaps) <= 60 * 1.2 + 1e-6
    assert min(gaps[20:]) >= 60 * 0.8 - 1e-6  # capped, not reset by short runs


def test_supervise_starts_over_after_a_run_that_lasted() -> None:
    """A loop that fails once in a while (after long healthy runs) is restarted after the
    shortest wait, however many times it failed before."""
    waits: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ended = [0.0]
        runs = itertools.count()

        async def body() -> None:
            n = next(runs)
            if n:
                waits.append(loop.time() - ended[0])
            if n == 400:
                return
            if n % 100 == 99:
                await asyncio.sleep(3600)  # a healthy hour, then the rare failure
            ended[0] = loop.time()
            raise RuntimeError("boom")

        await supervise("sometimes", body, backoff=Backoff(1.0, 60.0, jitter=0.0))

    with virtual_time() as runner:
        runner.run(scenario())
    assert [waits[i] for i in (99, 199, 299, 399)] == [1.0] * 4
    assert waits[98] == 60.0


async def test_supervise_does_not_restart_after_stop_during_its_backoff() -> None:
    stop = asyncio.Event()
    calls = []

    async def body() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    task = asyncio.create_task(supervise("t", body, backoff=Backoff(60, 60), stop=stop))
    await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 1.0)
    assert calls == [1]


@pytest.mark.parametrize(
    ("elapsed", "delay"),
    [(0.005, 0.015), (0.5, 1.5), (2.0, 6.0), (5.0, 15.0), (19.0, 15.0), (20.0, 0.0), (50.0, 0.0), (-1.0, 0.0)],
)
def test_a_slow_empty_answer_lengthens_the_idle_wait_within_bounds(elapsed: float, delay: float) -> None:
    """3× the answer's time, at most 15 s; a poll held 20 s or more by a long-polling Gitea
    is no sign of load."""
    assert slow_answer_delay(elapsed) == pytest.approx(delay)
