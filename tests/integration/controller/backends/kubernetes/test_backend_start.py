"""The kubernetes backend's side of the handshake on Pods the kubelet double runs: the start
as stage lines from the Pod and its events (scheduled, pulling, pulled, what holds it up),
ending STARTED or FAILED with the diagnosis; the watch waking the reaper for each changed Pod
and once for a start that ran out of time (the contract itself: tests/conformance/backends/)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from dynrunner.controller.backends.base import FailureReason, StartEvent, StartStage
from dynrunner.doubles.kubernetes.cluster import Cluster
from tests.fixtures.harness import wait_for
from tests.fixtures.kubernetes_backend import IMAGE, BackendFactory, job


async def follow(backend: object, env: object, within: float = 20.0) -> list[StartEvent]:
    async def events() -> list[StartEvent]:
        return [event async for event in backend.follow_start(env)]  # type: ignore[attr-defined]

    return await asyncio.wait_for(events(), within)


async def test_a_start_is_told_as_scheduled_pulling_pulled_then_started(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    # The Pod and its events come by two watches: with an instant pull the running Pod may
    # come before the Pulling event (under load, it did), and the start is over with no pulling
    # line. A real pull takes a while: here it lasts until the "pulling" line was told.
    hold = threading.Event()
    images = pod_cluster.kubelets["node-a"].options.images
    images[IMAGE] = dataclasses.replace(images[IMAGE], pull_hold=hold)
    async with kube_backend_factory(imagePullPolicy="Always") as backend:
        env = await backend.create(job("hang"))
        events: list[StartEvent] = []

        async def collect() -> None:
            async for event in backend.follow_start(env):
                events.append(event)

        following = asyncio.create_task(asyncio.wait_for(collect(), 60))
        try:
            await wait_for(lambda: len(events) >= 2 or following.done(), within=60, what="the pulling line")
        finally:
            hold.set()
        await following
        lines = [e.line for e in events if e.stage is StartStage.PROGRESS]
        assert lines[:2] == ["pod scheduled on node node-a", f"pulling image {IMAGE}"], lines
        # The kubelet writes the Pulled event and the running container separately: a start seen
        # running before that event is listed tells no "pulled" line (once in a fresh-clone run).
        assert all(line.startswith(f"image {IMAGE} pulled in ") for line in lines[2:]) and len(lines) <= 3, lines
        assert [e.stage for e in events][-1] is StartStage.STARTED
        assert events[-1].line.startswith("executor started on node node-a at ")
        again = await follow(backend, env)  # a running executor: STARTED at once, lines again
        assert [e.stage for e in again][-1] is StartStage.STARTED
        await backend.delete(env)


async def test_a_start_that_cannot_happen_ends_failed_with_the_diagnosis(
    kube_backend_factory: BackendFactory,
) -> None:
    image = "registry.example/none/executor:9"
    async with kube_backend_factory(image=image, imagePullTimeoutSeconds=1) as backend:
        env = await backend.create(job())
        events = await follow(backend, env)
        assert f"pulling image {image}" in [e.line for e in events]
        last = events[-1]
        assert last.stage is StartStage.FAILED and last.diagnosis is not None
        assert last.diagnosis.reason is FailureReason.START_FAILED
        assert last.diagnosis.message.startswith(f"the executor image {image} could not be pulled (")
        await backend.delete(env)


async def test_the_watch_wakes_once_when_a_start_runs_out_of_time(kube_backend_factory: BackendFactory) -> None:
    """No change in the Pod says an unschedulable start is over: the watch's tick does, once."""
    async with kube_backend_factory(nodeSelector={"gpu": "yes"}, startTimeoutSeconds=3) as backend:
        woken: list[str | None] = []
        watching = asyncio.create_task(backend.watch(woken.append))
        try:
            env = await backend.create(job())
            await asyncio.sleep(1.5)  # scheduled as unschedulable: the Pod changes no more
            woken.clear()
            deadline = asyncio.get_running_loop().time() + 5
            while env.assignment_id not in woken:
                assert asyncio.get_running_loop().time() < deadline, "no wake when the start ran out of time"
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.5)
            assert woken.count(env.assignment_id) == 1, "woken again for a Pod that did not change"
            assert (await backend.observe(env)).diagnosis.reason is FailureReason.UNSCHEDULABLE  # type: ignore[union-attr]
            await backend.delete(env)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
