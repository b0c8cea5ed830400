"""Capacity accounting: reserve before polling, bind on claim, release by the reaper."""

from __future__ import annotations

import asyncio

import pytest

from dynrunner.controller.coordination.capacity import Capacity


async def test_reserve_waits_until_a_permit_is_released() -> None:
    cap = Capacity("p", 2)
    first = await cap.reserve()
    second = await cap.reserve()
    first.bind("a")
    second.bind("b")
    assert (cap.in_use, cap.free) == (2, 0)
    waiting = asyncio.create_task(cap.reserve())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    assert cap.release("a")
    third = await asyncio.wait_for(waiting, 1)
    assert cap.taken == 2 and cap.in_use == 1
    third.cancel()
    assert cap.free == 1


async def test_a_reservation_is_used_once() -> None:
    cap = Capacity("p", 1)
    r = await cap.reserve()
    r.bind("a")
    with pytest.raises(RuntimeError):
        r.cancel()
    assert cap.holds("a")


async def test_cancelled_waiter_takes_nothing() -> None:
    cap = Capacity("p", 1)
    (await cap.reserve()).bind("a")
    waiting = asyncio.create_task(cap.reserve())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    cap.release("a")
    assert cap.taken == 0


async def test_restore_counts_environments_and_queued_assignments() -> None:
    cap = Capacity("p", 4)
    cap.restore(["e1", "e2"], pending=1)
    assert cap.in_use == 3 and cap.free == 1
    cap.adopt("q1")  # a queued assignment arrives: it takes a recovered permit
    assert cap.in_use == 3
    cap.adopt("e1")  # already held
    assert cap.in_use == 3
    cap.adopt("extra")  # claimed work always gets a permit, even over the limit
    assert cap.in_use == 4
    for aid in ("e1", "e2", "q1", "extra"):
        assert cap.release(aid)
    assert cap.in_use == 0
    assert not cap.release("e1")


async def test_recovered_permits_never_exceed_what_jetstream_holds() -> None:
    cap = Capacity("p", 4)
    cap.restore(["e1"], pending=2)
    cap.limit_recovered(1)
    assert cap.in_use == 2
    cap.limit_recovered(5)
    assert cap.in_use == 2
    cap.limit_recovered(0)
    assert cap.in_use == 1


async def test_adopt_before_bind_counts_once() -> None:
    """The launcher may receive the assignment before the claimer binds its reservation."""
    cap = Capacity("p", 2)
    r = await cap.reserve()
    cap.adopt("a")
    r.bind("a")
    assert cap.in_use == 1 and cap.taken == 1


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Capacity("p", 0)
