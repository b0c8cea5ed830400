"""Each diagnosis of the kubernetes backend, on Pods the kubelet double really runs (the
classifier's own cases are unit-tested on recorded Pod JSON)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from dynrunner.controller.backends.base import Environment, FailureReason, Observation, Phase
from dynrunner.doubles.kubernetes.cluster import Cluster
from dynrunner.proto.gitea import Result
from tests.fixtures.kubernetes import api_client
from tests.fixtures.kubernetes_backend import (
    NOTHING_LEFT,
    BackendFactory,
    claimed,
    job,
    job_workflow,
    left_over,
    until,
)

NS = "ci-jobs"


async def finished(backend: Any, env: Environment, within: float = 20.0) -> Observation:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        observation: Observation = await backend.observe(env)
        if observation.phase.finished:
            return observation
        assert asyncio.get_running_loop().time() < deadline, f"still {observation.phase}"
        await asyncio.sleep(0.05)


async def running(backend: Any, env: Environment) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while (await backend.observe(env)).phase is not Phase.RUNNING:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)


def reason_and_message(observation: Observation) -> tuple[FailureReason, str]:
    assert observation.phase is Phase.FAILED and observation.diagnosis is not None, observation
    return observation.diagnosis.reason, observation.diagnosis.message


async def test_an_image_that_cannot_be_pulled(kube_backend_factory: BackendFactory, pod_cluster: Cluster) -> None:
    async with kube_backend_factory(image="registry.example/none/executor:9", imagePullTimeoutSeconds=1) as backend:
        env = await backend.create(job())
        reason, message = reason_and_message(await finished(backend, env))
        assert reason is FailureReason.START_FAILED
        assert message.startswith("the executor image registry.example/none/executor:9 could not be pulled (")
        assert "not found" in message
        await backend.delete(env)


async def test_a_job_container_image_that_cannot_be_pulled(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    """Named with the job container, not as the executor's image (the double pulls every
    image before it starts a container; a kubelet starts the executor first)."""
    text = job_workflow("hang") + "    container: registry.example/none/job:1\n"
    async with kube_backend_factory(imagePullTimeoutSeconds=1) as backend:
        env = await backend.create(claimed(workflow=text, assignment_id=str(uuid.uuid4())))
        reason, message = reason_and_message(await finished(backend, env))
        assert reason is FailureReason.START_FAILED
        assert message.startswith("the image registry.example/none/job:1 of the job container could not be pulled (")
        await backend.delete(env)
        await until(lambda: left_over(pod_cluster) == NOTHING_LEFT)


async def test_a_pod_no_node_can_run(kube_backend_factory: BackendFactory) -> None:
    options = {"nodeSelector": {"gpu": "yes"}, "startTimeoutSeconds": 1}
    async with kube_backend_factory(**options) as backend:
        env = await backend.create(job())
        reason, message = reason_and_message(await finished(backend, env))
        assert reason is FailureReason.UNSCHEDULABLE
        assert message.startswith("no node could run the job's Pod within 1s: 0/1 nodes are available: ")
        assert "node(s) didn't match Pod's node affinity/selector" in message
        await backend.delete(env)


async def test_a_container_that_cannot_be_configured(kube_backend_factory: BackendFactory) -> None:
    env_from_nowhere = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "token"}}}]
    template = {"spec": {"containers": [{"name": "executor", "env": env_from_nowhere}]}}
    async with kube_backend_factory(podTemplate=template) as backend:
        env = await backend.create(job())
        reason, message = reason_and_message(await finished(backend, env))
        assert (reason, message) == (
            FailureReason.START_FAILED,
            'the executor\'s container could not be created (CreateContainerConfigError): secret "absent" not found',
        )
        await backend.delete(env)


async def test_a_volume_that_cannot_be_mounted(kube_backend_factory: BackendFactory) -> None:
    """No SPIFFE CSI driver on the node: FailedMount events, then the start time-out."""
    volume = {"csi": {"driver": "csi.example.com", "readOnly": True}}
    async with kube_backend_factory(workloadApiVolume=volume, startTimeoutSeconds=1) as backend:
        env = await backend.create(job())
        reason, message = reason_and_message(await finished(backend, env))
        assert reason is FailureReason.START_FAILED
        assert message.startswith("the job's Pod could not start within 1s (FailedMount): MountVolume.SetUp failed")
        assert "driver name csi.example.com not found" in message
        await backend.delete(env)


@pytest.mark.parametrize(
    ("disaster", "reason", "message"),
    [
        (
            "oom",
            FailureReason.OUT_OF_MEMORY,
            "the job ran out of memory (memory limit 1Gi): the executor was OOMKilled",
        ),
        (
            "evict",
            FailureReason.EVICTED,
            "the job's Pod was evicted by its node: The node was low on resource: memory.",
        ),
        (
            "lose",
            FailureReason.VANISHED,
            "the node node-a running the job stopped responding (node lost); Kubernetes deleted the job's Pod",
        ),
    ],
)
async def test_a_pod_that_ends_under_the_job(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster, disaster: str, reason: FailureReason, message: str
) -> None:
    async with kube_backend_factory(resources={"limits": {"memory": "1Gi"}}) as backend:
        env = await backend.create(job("hang"))
        await running(backend, env)
        if disaster == "oom":
            pod_cluster.oom_kill(NS, env.name)
        elif disaster == "evict":
            pod_cluster.evict(NS, env.name)
        else:
            pod_cluster.lose_node("node-a")
        found = reason_and_message(await finished(backend, env, within=30))
        assert found[0] is reason and found[1].startswith(message), found
        await backend.delete(env)


async def test_the_pods_deadline(kube_backend_factory: BackendFactory) -> None:
    template = {"spec": {"activeDeadlineSeconds": 1, "terminationGracePeriodSeconds": 1}}
    async with kube_backend_factory(podTemplate=template) as backend:
        env = await backend.create(job("hang"))
        reason, message = reason_and_message(await finished(backend, env))
        assert reason is FailureReason.DEADLINE_EXCEEDED
        assert message.startswith("the job's Pod ran longer than its deadline (1s")
        await backend.delete(env)


async def test_a_pod_deleted_by_someone_else_is_a_tombstone_until_reaped(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    async with kube_backend_factory() as backend:
        env = await backend.create(job("hang"))
        await running(backend, env)
        with api_client(pod_cluster.api) as api:
            client.CoreV1Api(api).delete_namespaced_pod(env.name, NS, grace_period_seconds=0)
        reason, message = reason_and_message(await finished(backend, env))
        assert reason is FailureReason.VANISHED
        assert "deleted by someone other than the controller" in message
        assert [e.name for e in await backend.list_owned()] == [env.name]  # until the reaper is done
        assert (await backend.find(env.assignment_id)) is not None  # its tombstone, for the reaper
        await backend.delete(env)
        assert await backend.list_owned() == []
        await until(lambda: left_over(pod_cluster) == NOTHING_LEFT)


async def test_an_executor_that_fails_before_reporting(kube_backend_factory: BackendFactory) -> None:
    async with kube_backend_factory() as backend:
        env = await backend.create(job("exit:3"))
        observation = await finished(backend, env)
        reason, message = reason_and_message(observation)
        assert (reason, message) == (
            FailureReason.EXECUTOR_FAILED,
            "the executor exited with status 3 before it reported the job's result",
        )
        assert observation.diagnosis is not None and "exit:3" in observation.diagnosis.detail
        await backend.delete(env)


async def test_a_pod_killed_under_its_job_gives_the_steps_gitea_accepted(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    """Issue 18 item 7: what the executor kept as its termination message reaches the reaper
    through the kubelet (read when the container is killed) and the observation."""
    async with kube_backend_factory(resources={"limits": {"memory": "1Gi"}}) as backend:
        env = await backend.create(job("accepted"))
        await running(backend, env)
        with api_client(pod_cluster.api) as api:
            v1 = client.CoreV1Api(api)
            await until(lambda: "accepted" in v1.read_namespaced_pod_log(env.name, NS, container="executor"))
        pod_cluster.oom_kill(NS, env.name)
        observation = await finished(backend, env, within=30)
        assert reason_and_message(observation)[0] is FailureReason.OUT_OF_MEMORY
        assert observation.reported is not None
        assert [(s.result, s.started_at) for s in observation.reported.steps] == [
            (Result.SUCCESS, None),
            (Result.UNSPECIFIED, datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)),
        ]
        await backend.delete(env)
