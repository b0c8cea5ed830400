"""The Backend contract (controller/.../backends/base.py, docs/backends.md "The handshake"),
proved the same way for every backend: each runs this module through its scenario driver
(tests/fixtures/conformance/)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest

from dynrunner.controller import contract
from dynrunner.controller.backends.base import (
    Backend,
    Environment,
    FailureReason,
    Observation,
    Phase,
    StartEvent,
    StartStage,
    Watches,
)
from tests.fixtures.conformance import Behaviour, Fault, ScenarioDriver

QUIET_S = 1.5
"""Long enough for a watch that polls (local: every second) to have looked again."""


async def until(what: str, check: Callable[[], Awaitable[bool]], within: float, every: float = 0.05) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:g}s")
        await asyncio.sleep(every)


async def observed(backend: Backend, env: Environment, settle_s: float, *phases: Phase) -> Observation:
    """The first observation in one of `phases` (polled: the suite checks `observe`, not a watch)."""
    seen: list[Observation] = []

    async def reached() -> bool:
        seen.append(await backend.observe(env))
        return seen[-1].phase in phases

    await until(f"{env.name} reaching {'/'.join(p.value for p in phases)} (last: {seen[-1:]})", reached, settle_s)
    return seen[-1]


async def start(backend: Backend, env: Environment, settle_s: float) -> list[StartEvent]:
    """Follow the start to its end, as the launcher does: one event at a time."""

    async def follow() -> list[StartEvent]:
        return [event async for event in backend.follow_start(env)]

    return await asyncio.wait_for(follow(), settle_s)


def assert_well_formed(events: list[StartEvent]) -> None:
    """Progress, at most one STARTING, then exactly one final event, last."""
    assert events, "follow_start ended without a final event"
    *before, last = events
    assert last.stage.final, events
    assert all(not e.stage.final for e in before), events
    assert sum(e.stage is StartStage.STARTING for e in before) <= 1, events
    if last.stage is StartStage.FAILED:
        assert last.diagnosis is not None, events


@asynccontextmanager
async def launched(
    driver: ScenarioDriver, behaviour: Behaviour, **kw: object
) -> AsyncIterator[tuple[Backend, Environment, list[StartEvent]]]:
    """A backend with one environment created and its start followed to the end."""
    async with driver.backend() as backend:
        env = await backend.create(driver.assignment(behaviour, **kw), stream_seq=7)  # type: ignore[arg-type]
        events = await start(backend, env, driver.settle_s)
        try:
            yield backend, env, events
        finally:
            await backend.delete(env)


# -- create -------------------------------------------------------------------------------------


async def test_create_returns_the_environment_with_the_contract_labels(driver: ScenarioDriver) -> None:
    a = driver.assignment(Behaviour.RUN)
    async with driver.backend() as backend:
        env = await backend.create(a, stream_seq=42)
        try:
            assert env.name == contract.environment_name(a.assignment_id)
            assert env.backend == backend.name == driver.name
            assert dict(env.labels) == {**env.labels, **contract.environment_labels(a, 42)}
            assert (env.assignment_id, env.task_id, env.pool, env.stream_seq) == (
                a.assignment_id,
                a.task.id,
                a.pool,
                42,
            )
            found = await backend.find(a.assignment_id)
            assert found is not None and found.name == env.name and found.stream_seq == 42
        finally:
            await backend.delete(env)


async def test_create_twice_makes_one_environment(driver: ScenarioDriver) -> None:
    a = driver.assignment(Behaviour.RUN)
    async with driver.backend() as backend:
        first = await backend.create(a, stream_seq=1)
        again = await backend.create(a, stream_seq=1)
        try:
            assert again.name == first.name
            assert [e.assignment_id for e in await backend.list_owned()] == [a.assignment_id]
        finally:
            await backend.delete(first)


async def test_concurrent_creates_make_one_environment_that_starts_once(driver: ScenarioDriver) -> None:
    a = driver.assignment(Behaviour.RUN)
    async with driver.backend() as backend, driver.backend() as other:
        envs = await asyncio.gather(*(b.create(a, stream_seq=1) for b in (backend, other, backend)))
        try:
            assert {e.name for e in envs} == {contract.environment_name(a.assignment_id)}
            assert [e.assignment_id for e in await backend.list_owned()] == [a.assignment_id]
            followed = await asyncio.gather(*(start(b, envs[0], driver.settle_s) for b in (backend, other)))
            for events in followed:
                assert_well_formed(events)
                assert events[-1].stage is StartStage.STARTED
            assert (await backend.observe(envs[0])).phase is Phase.RUNNING
        finally:
            await backend.delete(envs[0])


async def test_create_completes_a_half_made_environment(driver: ScenarioDriver) -> None:
    a = driver.assignment(Behaviour.SUCCEED)
    async with driver.backend() as backend:
        await driver.half_create(backend, a)
        assert await backend.find(a.assignment_id) is None
    async with driver.backend() as backend:
        env = await backend.create(a, stream_seq=3)
        try:
            assert (await backend.find(a.assignment_id)) is not None
            events = await start(backend, env, driver.settle_s)
            assert_well_formed(events)
            assert events[-1].stage is StartStage.STARTED
            assert (await observed(backend, env, driver.settle_s, Phase.SUCCEEDED)).phase is Phase.SUCCEEDED
        finally:
            await backend.delete(env)


# -- find and list ------------------------------------------------------------------------------


async def test_find_and_list_by_labels(driver: ScenarioDriver) -> None:
    a, b = driver.assignment(Behaviour.RUN), driver.assignment(Behaviour.RUN)
    async with driver.backend() as backend:
        assert await backend.find(a.assignment_id) is None
        envs = [await backend.create(one) for one in (a, b)]
        try:
            listed = {e.assignment_id: e for e in await backend.list_owned()}
            assert set(listed) == {a.assignment_id, b.assignment_id}
            for one in (a, b):
                env = listed[one.assignment_id]
                assert (env.task_id, env.pool, env.stream_seq) == (one.task.id, one.pool, None)
                assert env.created_at <= datetime.now(UTC) + timedelta(seconds=5)
        finally:
            for env in envs:
                await backend.delete(env)
        assert await backend.list_owned() == []
        assert await backend.find(a.assignment_id) is None


# -- start progress -----------------------------------------------------------------------------


@pytest.mark.parametrize("behaviour", [Behaviour.SUCCEED, Behaviour.RUN])
async def test_start_progress_ends_with_the_executor_started(driver: ScenarioDriver, behaviour: Behaviour) -> None:
    async with launched(driver, behaviour) as (backend, env, events):
        assert_well_formed(events)
        assert events[-1].stage is StartStage.STARTED
        assert all(e.line or e.stage is not StartStage.STARTING for e in events), "STARTING carries its line"
        phase = (await backend.observe(env)).phase
        assert phase in (Phase.RUNNING, Phase.SUCCEEDED)


async def test_start_progress_of_an_executor_that_cannot_start_ends_with_a_diagnosis(
    driver: ScenarioDriver,
) -> None:
    async with launched(driver, Behaviour.NEVER_START) as (backend, env, events):
        assert_well_formed(events)
        if events[-1].stage is StartStage.FAILED:
            assert events[-1].diagnosis is not None
            assert events[-1].diagnosis.reason is FailureReason.START_FAILED
        # A backend that learns it only from the executor's exit (local: exit 127) says STARTED,
        # and observing says why.
        obs = await observed(backend, env, driver.settle_s, Phase.FAILED)
        assert obs.diagnosis is not None and obs.diagnosis.reason is FailureReason.START_FAILED


async def test_following_again_picks_up_where_the_start_is(driver: ScenarioDriver) -> None:
    async with launched(driver, Behaviour.RUN) as (_, env, _events):
        async with driver.backend() as restarted:
            again = await start(restarted, env, driver.settle_s)
        assert [e.stage for e in again if e.stage.final] == [StartStage.STARTED]
        assert not any(e.stage is StartStage.STARTING for e in again), "a running executor is not started again"


async def test_a_restarted_backend_follows_and_completes_a_start_it_did_not_begin(driver: ScenarioDriver) -> None:
    """The controller died after `create` (the delivery was acknowledged) and before the start
    was followed: a new backend object's `follow_start` gets the job running."""
    a = driver.assignment(Behaviour.SUCCEED)
    async with driver.backend() as backend:
        env = await backend.create(a, stream_seq=5)
    async with driver.backend() as restarted:
        try:
            events = await start(restarted, env, driver.settle_s)
            assert_well_formed(events)
            assert events[-1].stage is StartStage.STARTED
            assert (await observed(restarted, env, driver.settle_s, Phase.SUCCEEDED)).phase is Phase.SUCCEEDED
        finally:
            await restarted.delete(env)


async def test_closing_the_start_before_starting_leaves_the_executor_unstarted(driver: ScenarioDriver) -> None:
    """What the launcher does when the task ended while it followed: stop asking."""
    async with driver.backend() as backend:
        env = await backend.create(driver.assignment(Behaviour.SUCCEED))
        try:
            events = backend.follow_start(env)
            async for event in events:  # pragma: no branch
                if event.stage is StartStage.STARTING or event.stage.final:
                    break
            await events.aclose()  # type: ignore[attr-defined]
            if event.stage is StartStage.STARTING:
                await asyncio.sleep(min(1.0, driver.settle_s / 4))
                assert (await backend.observe(env)).phase is Phase.STARTING
        finally:
            await backend.delete(env)


# -- observing ----------------------------------------------------------------------------------


async def test_an_executor_that_reported_is_succeeded(driver: ScenarioDriver) -> None:
    async with launched(driver, Behaviour.SUCCEED) as (backend, env, _):
        obs = await observed(backend, env, driver.settle_s, Phase.SUCCEEDED, Phase.FAILED)
        assert (obs.phase, obs.diagnosis) == (Phase.SUCCEEDED, None)


async def test_an_executor_that_exits_3_is_executor_failed(driver: ScenarioDriver) -> None:
    async with launched(driver, Behaviour.EXIT_3) as (backend, env, _):
        obs = await observed(backend, env, driver.settle_s, Phase.SUCCEEDED, Phase.FAILED)
        assert obs.phase is Phase.FAILED and obs.diagnosis is not None
        assert obs.diagnosis.reason is FailureReason.EXECUTOR_FAILED
        assert obs.exit_code == 3
        assert "3" in obs.diagnosis.message


async def test_a_killed_executor_is_killed(driver: ScenarioDriver) -> None:
    async with launched(driver, Behaviour.RUN) as (backend, env, _):
        await observed(backend, env, driver.settle_s, Phase.RUNNING)
        await driver.inflict(env, Fault.KILL_EXECUTOR)
        obs = await observed(backend, env, driver.settle_s, Phase.FAILED, Phase.SUCCEEDED)
        assert obs.phase is Phase.FAILED and obs.diagnosis is not None
        assert obs.diagnosis.reason in (FailureReason.KILLED, FailureReason.OUT_OF_MEMORY), obs
        assert "KILL" in obs.diagnosis.message or "kill" in obs.diagnosis.message


async def test_an_executor_past_its_deadline_is_deadline_exceeded(driver: ScenarioDriver) -> None:
    deadline = datetime.now(UTC) + timedelta(seconds=0.5)
    async with launched(driver, Behaviour.RUN, deadline=deadline) as (backend, env, _):
        obs = await observed(backend, env, driver.settle_s, Phase.FAILED, Phase.SUCCEEDED)
        assert obs.phase is Phase.FAILED and obs.diagnosis is not None
        assert obs.diagnosis.reason is FailureReason.DEADLINE_EXCEEDED


async def test_an_environment_deleted_behind_our_back_is_gone_or_vanished(driver: ScenarioDriver) -> None:
    async with launched(driver, Behaviour.RUN) as (backend, env, _):
        await observed(backend, env, driver.settle_s, Phase.RUNNING)
        await driver.inflict(env, Fault.DELETE_BEHIND_OUR_BACK)
        obs = await observed(backend, env, driver.settle_s, Phase.GONE, Phase.FAILED)
        if obs.phase is Phase.FAILED:
            assert obs.diagnosis is not None and obs.diagnosis.reason is FailureReason.VANISHED
        # The reaper can still delete it: what is left (a tombstone, nothing) goes without error.
        await backend.delete(env)
        assert await backend.find(env.assignment_id) is None


# -- deleting and collecting --------------------------------------------------------------------


async def test_delete_stops_the_executor_and_deleting_the_missing_is_success(driver: ScenarioDriver) -> None:
    async with launched(driver, Behaviour.RUN) as (backend, env, _):
        await observed(backend, env, driver.settle_s, Phase.RUNNING)
        await backend.delete(env)
        assert await backend.find(env.assignment_id) is None
        assert env.assignment_id not in {e.assignment_id for e in await backend.list_owned()}
        await backend.delete(env)  # again: nothing there, no error
        obs = await backend.observe(env)
        assert obs.phase is Phase.GONE


async def test_orphans_are_collected_unless_being_launched(driver: ScenarioDriver) -> None:
    kept, collected = await driver.make_orphan(), await driver.make_orphan()
    async with driver.backend() as backend:
        async with launched(driver, Behaviour.RUN) as (_, env, _events):
            removed = await backend.collect_orphans([kept.assignment_id])
            assert await driver.orphan_exists(kept)
            assert not await driver.orphan_exists(collected)
            assert removed, "collect_orphans says what it removed"
            assert await backend.find(env.assignment_id) is not None, "a live environment is no orphan"
        await backend.collect_orphans([])
        assert not await driver.orphan_exists(kept)


# -- restart recovery ---------------------------------------------------------------------------


async def test_a_new_backend_object_finds_observes_and_reaps_what_the_old_one_made(driver: ScenarioDriver) -> None:
    a = driver.assignment(Behaviour.EXIT_3)
    async with driver.backend() as old:
        env = await old.create(a, stream_seq=9)
        await start(old, env, driver.settle_s)
    async with driver.backend() as new:
        [found] = await new.list_owned()
        assert (found.assignment_id, found.stream_seq) == (a.assignment_id, 9)
        obs = await observed(new, found, driver.settle_s, Phase.FAILED, Phase.SUCCEEDED)
        assert obs.diagnosis is not None and obs.diagnosis.reason is FailureReason.EXECUTOR_FAILED
        await new.delete(found)
        assert await new.list_owned() == []


# -- the watch ----------------------------------------------------------------------------------


async def test_the_watch_wakes_the_reaper_on_changes_only(driver: ScenarioDriver) -> None:
    """A failed environment that stays failed wakes nobody again (no wake storm); the next
    change — it vanishing — wakes the reaper."""
    async with driver.backend() as backend:
        if not isinstance(backend, Watches):
            pytest.skip(f"{driver.name} has no watch: the reaper sweeps it every second")
        woken: list[str | None] = []
        watching = asyncio.create_task(backend.watch(woken.append))
        try:
            a = driver.assignment(Behaviour.EXIT_3)
            env = await backend.create(a)
            await start(backend, env, driver.settle_s)
            await observed(backend, env, driver.settle_s, Phase.FAILED)
            for _ in range(5):
                woken.clear()
                await asyncio.sleep(QUIET_S)
                if a.assignment_id not in woken and None not in woken:
                    break
            else:
                raise AssertionError(f"the watch keeps waking for an environment that does not change: {woken}")

            async def woken_for_it() -> bool:
                return a.assignment_id in woken or None in woken

            await driver.inflict(env, Fault.DELETE_BEHIND_OUR_BACK)
            await until("a wake after the environment vanished", woken_for_it, driver.settle_s)
            await backend.delete(env)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)


async def test_the_watch_says_when_an_executor_exits(driver: ScenarioDriver) -> None:
    async with driver.backend() as backend:
        if not isinstance(backend, Watches):
            pytest.skip(f"{driver.name} has no watch: the reaper sweeps it every second")
        woken: list[str | None] = []
        watching = asyncio.create_task(backend.watch(woken.append))
        try:
            a = driver.assignment(Behaviour.RUN)
            env = await backend.create(a)
            await start(backend, env, driver.settle_s)
            await observed(backend, env, driver.settle_s, Phase.RUNNING)
            woken.clear()
            await driver.inflict(env, Fault.KILL_EXECUTOR)

            async def woken_for_it() -> bool:
                return a.assignment_id in woken or None in woken

            await until("a wake after the executor was killed", woken_for_it, driver.settle_s, every=0.01)
            assert (await backend.observe(env)).phase is Phase.FAILED
            await backend.delete(env)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)


async def test_the_watch_says_when_an_environment_it_saw_made_vanished_at_once(driver: ScenarioDriver) -> None:
    """Made and gone within one look of a polling watch: still a wake (the reaper knew of it)."""
    async with driver.backend() as backend:
        if not isinstance(backend, Watches):
            pytest.skip(f"{driver.name} has no watch: the reaper sweeps it every second")
        woken: list[str | None] = []
        watching = asyncio.create_task(backend.watch(woken.append))
        try:
            await asyncio.sleep(0.1)  # the watch runs
            a = driver.assignment(Behaviour.RUN)
            env = await backend.create(a)
            await driver.inflict(env, Fault.DELETE_BEHIND_OUR_BACK)
            woken.clear()

            async def woken_for_it() -> bool:
                return a.assignment_id in woken or None in woken

            await until("a wake for the vanished environment", woken_for_it, driver.settle_s)
            await backend.delete(env)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
