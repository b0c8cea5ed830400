"""The kubernetes backend's watch survives what a real API server does to watches (dropped
connections, 410 Gone after compaction, 5xx answers), polls nothing while jobs run, and
collects what interrupted launches leave behind."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from kubernetes import client

from dynrunner.controller.backends.base import Phase
from dynrunner.doubles.kubernetes.cluster import Cluster
from tests.fixtures.kubernetes import CSE, api_client, cse_body
from tests.fixtures.kubernetes_backend import NOTHING_LEFT, BackendFactory, job, left_over, until

NS = "ci-jobs"


async def phase_of(backend: Any, assignment_id: str) -> Phase | None:
    env = await backend.find(assignment_id)
    return None if env is None else (await backend.observe(env)).phase


async def test_the_cache_follows_through_dropped_and_expired_watches(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    async with kube_backend_factory() as backend:
        first = job("hang")
        env = await backend.create(first)
        await until(lambda: phase_of(backend, first.assignment_id), within=20)
        lists = backend.pods.lists
        pod_cluster.api.drop_watches()
        second = job("exit:0")
        await backend.create(second)
        await until(lambda: _is(backend, second.assignment_id, Phase.SUCCEEDED))
        assert backend.pods.lists == lists, "a dropped connection resumes from its resourceVersion, no list"
        pod_cluster.api.compact()
        pod_cluster.api.expire_watches()
        with api_client(pod_cluster.api) as api:
            client.CoreV1Api(api).delete_namespaced_pod(env.name, NS, grace_period_seconds=0)
        await until(lambda: backend.pods.lists > lists)  # 410: listed again
        await until(lambda: _is(backend, first.assignment_id, Phase.FAILED, tombstone=True))
        for one in await backend.list_owned():
            await backend.delete(one)
        await until(lambda: left_over(pod_cluster) == NOTHING_LEFT)


async def _is(backend: Any, assignment_id: str, phase: Phase, tombstone: bool = False) -> bool:
    envs = {e.assignment_id: e for e in await backend.list_owned()}
    env = envs.get(assignment_id)
    if env is None:
        return False
    return (await backend.observe(env)).phase is phase and (not tombstone or env.name not in backend.pods.cache)


async def test_no_request_while_jobs_run(kube_backend_factory: BackendFactory, pod_cluster: Cluster) -> None:
    async with kube_backend_factory() as backend:
        envs = [await backend.create(job("hang")) for _ in range(3)]
        await until(lambda: all(backend.entries.made_for(e.assignment_id) for e in envs))
        before = backend.api.requests
        for _ in range(20):  # a reaper's sweeps: list and observe every job
            for env in await backend.list_owned():
                await backend.observe(env)
            await asyncio.sleep(0.05)
        assert backend.api.requests == before
        for env in envs:
            await backend.delete(env)


async def test_transient_api_errors_are_retried(kube_backend_factory: BackendFactory, pod_cluster: Cluster) -> None:
    async with kube_backend_factory() as backend:
        await backend.list_owned()  # watching
        pod_cluster.api.faults.fail(count=2, code=503, method="POST", path="/pods")
        pod_cluster.api.faults.fail(count=1, code=500, method="POST", path="/secrets")
        env = await backend.create(job("exit:0"))
        await until(lambda: _is(backend, env.assignment_id, Phase.SUCCEEDED))
        await backend.delete(env)


async def test_orphans_are_collected(kube_backend_factory: BackendFactory, pod_cluster: Cluster) -> None:
    """An entry whose Pod is gone, and a Secret whose launch never made its Pod; entries and
    Secrets of other pools, namespaces and owners stay."""
    async with kube_backend_factory() as backend:
        live = await backend.create(job("hang"))
        await until(lambda: backend.entries.made_for(live.assignment_id))
        labels = {
            "app.kubernetes.io/managed-by": "dynrunner",
            "dynrunner.io/pool": "pod",
            "dynrunner.io/namespace": NS,
            "dynrunner.io/pod-uid": "gone-uid",
            "dynrunner.io/assignment-id": "gone",
        }
        with api_client(pod_cluster.api) as api:
            custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
            custom.create_cluster_custom_object(*CSE, cse_body("dr-gone", labels=labels))
            custom.create_cluster_custom_object(
                *CSE, cse_body("dr-other-pool", labels={**labels, "dynrunner.io/pool": "other"})
            )
            secret_labels = {k: v for k, v in labels.items() if k != "dynrunner.io/pod-uid"}
            core.create_namespaced_secret(NS, {"metadata": {"name": "dr-gone", "labels": secret_labels}})
            core.create_namespaced_secret(NS, {"metadata": {"name": "unrelated"}})
        assert await backend.collect_orphans(set()) == ["ClusterStaticEntry dr-gone"]  # the Secret is too young
        backend.orphan_age = timedelta(0)
        assert await backend.collect_orphans(set()) == [f"Secret {NS}/dr-gone"]
        assert await backend.collect_orphans({"x"}) == []
        remaining = left_over(pod_cluster)
        assert sorted(remaining["entries"]) == sorted(["dr-other-pool", live.name])
        assert sorted(remaining["secrets"]) == sorted(["unrelated", live.name])
        await backend.delete(live)


async def test_a_pod_just_created_is_known_before_its_watch_event(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    """Observing right after `create` must never say the Pod is gone (the reaper would end
    the job): the created object is in the cache before the watch delivers it."""
    async with kube_backend_factory() as backend:
        await backend.list_owned()
        pod_cluster.api.drop_watches()  # the watch reconnects after a backoff: its events come late
        env = await backend.create(job("hang"))
        observation = await backend.observe(env)
        assert not observation.phase.finished, observation
        found = await backend.find(env.assignment_id)
        assert found is not None and found.name == env.name
        await backend.delete(env)
