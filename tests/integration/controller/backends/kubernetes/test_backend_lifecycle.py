"""The kubernetes backend against the API, kubelet and SPIRE doubles: a job's Secret, Pod and
ClusterStaticEntry are made, the executor gets exactly its identity, and deleting leaves
nothing behind."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from kubernetes import client

from dynrunner.controller.backends.base import JobRefused, Phase
from dynrunner.doubles.kubernetes.cluster import Cluster
from tests.fixtures.kubernetes import CSE, api_client
from tests.fixtures.kubernetes_backend import NOTHING_LEFT, BackendFactory, claimed, job, left_over, until

NS = "ci-jobs"


def raw(cluster: Cluster, kind: str, name: str) -> dict[str, Any]:
    with api_client(cluster.api) as api:
        if kind == "entry":
            return dict(client.CustomObjectsApi(api).get_cluster_custom_object(*CSE, name))
        core = client.CoreV1Api(api)
        read = core.read_namespaced_pod if kind == "pod" else core.read_namespaced_secret
        return dict(api.sanitize_for_serialization(read(name, NS)))


async def test_a_job_runs_with_its_own_identity_and_leaves_nothing(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    assignment = job("svid")
    async with kube_backend_factory() as backend:
        env = await backend.create(assignment, stream_seq=3)
        name = env.name
        assert env.labels["dynrunner.io/stream-seq"] == "3" and env.assignment_id == assignment.assignment_id
        secret = raw(pod_cluster, "secret", name)
        pod = raw(pod_cluster, "pod", name)
        assert secret["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"], "controller": True}
        ]
        observation = await until(lambda: _finished(backend, env))
        assert observation.phase is Phase.SUCCEEDED, observation
        pod = raw(pod_cluster, "pod", name)
        message = json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
        assert message == {"spiffeId": "spiffe://example.org/ci/acme/widgets/build"}
        entry = raw(pod_cluster, "entry", name)
        assert (
            entry["spec"]["parentID"]
            == f"spiffe://example.org/spire/agent/k8s_psat/ci/{pod_cluster.node_uid('node-a')}"
        )
        assert entry["spec"]["selectors"] == [
            f"k8s:ns:{NS}",
            f"k8s:pod-uid:{pod['metadata']['uid']}",
            "k8s:container-name:executor",
        ]
        await backend.delete(env)
        await until(lambda: left_over(pod_cluster) == NOTHING_LEFT)
        assert await backend.list_owned() == []


async def _finished(backend: Any, env: Any) -> Any:
    observation = await backend.observe(env)
    return observation if observation.phase.finished else None


async def test_create_is_idempotent_and_completes_a_half_made_pair(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    first, second = job("hang"), job("hang")
    async with kube_backend_factory() as backend:
        env = await backend.create(first)
        again = await backend.create(first)
        assert again.name == env.name and again.extra["uid"] == env.extra["uid"]
        # A Secret without its Pod (a launch that died between the two): the Pod is made.
        with api_client(pod_cluster.api) as api:
            core = client.CoreV1Api(api)
            core.create_namespaced_secret(
                NS, {"metadata": {"name": f"dr-{second.assignment_id}"}, "stringData": {"assignment.pb": "stale"}}
            )
        made = await backend.create(second)
        assert raw(pod_cluster, "pod", made.name)["metadata"]["uid"] == made.extra["uid"]
        await until(lambda: len(left_over(pod_cluster)["pods"]) == 2)
        assert sorted(e.name for e in await backend.list_owned()) == sorted([env.name, made.name])
        assert (await backend.find(first.assignment_id)) is not None
        for one in await backend.list_owned():
            await backend.delete(one)
        await until(lambda: left_over(pod_cluster)["pods"] == [] and left_over(pod_cluster)["secrets"] == [])


async def test_a_pod_without_its_secret_gets_it(kube_backend_factory: BackendFactory, pod_cluster: Cluster) -> None:
    from dynrunner.controller.backends.kubernetes import builders
    from tests.fixtures.kubernetes_backend import settings

    assignment = job("exit:0")
    with api_client(pod_cluster.api) as api:
        client.CoreV1Api(api).create_namespaced_pod(NS, builders.pod(assignment, settings()))
    async with kube_backend_factory() as backend:
        env = await backend.create(assignment)
        observation = await until(lambda: _finished(backend, env))
        assert observation.phase is Phase.SUCCEEDED
        await backend.delete(env)


SERVICES_WORKFLOW = """on: push
jobs:
  build:
    runs-on: [self-hosted, pod]
    env:
      FAKE_EXECUTOR: 'exit:0'
    services:
      cache:
        image: registry.example.com/team/redis:7
        ports: ['6379']
        credentials: {username: bot, password: hunter2}
        options: --health-cmd "redis-cli ping" --user 999
"""


async def test_services_get_a_pull_secret_owned_by_the_pod(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    """The API server accepts the Pod with its sidecar; the per-job pull secret belongs to the
    Pod (garbage-collected with it) and is deleted with the job."""
    assignment = claimed(workflow=SERVICES_WORKFLOW, assignment_id=str(uuid.uuid4()))
    async with kube_backend_factory() as backend:
        env = await backend.create(assignment)
        pod = raw(pod_cluster, "pod", env.name)
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["cache"]
        assert pod["spec"]["imagePullSecrets"] == [{"name": f"{env.name}-pull"}]
        pull = raw(pod_cluster, "secret", f"{env.name}-pull")
        assert pull["type"] == "kubernetes.io/dockerconfigjson"
        assert pull["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        await backend.delete(env)
        await until(lambda: left_over(pod_cluster) == NOTHING_LEFT)


async def test_a_job_container_is_accepted_and_its_credentials_join_the_pull_secret(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    """The API server accepts the Pod with the agent's init container and the job container;
    the job container's login is in the per-job pull Secret the Pod owns."""
    container = (
        "    container:\n      image: ghcr.io/team/builder:1\n      credentials: {username: ci, password: s3cret}\n"
    )
    text = SERVICES_WORKFLOW.replace("    services:\n", container + "    services:\n")
    assignment = claimed(workflow=text, assignment_id=str(uuid.uuid4()))
    async with kube_backend_factory() as backend:
        env = await backend.create(assignment)
        pod = raw(pod_cluster, "pod", env.name)
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["dynrunner-agent-install", "cache"]
        assert [c["name"] for c in pod["spec"]["containers"]] == ["executor", "job"]
        pull = raw(pod_cluster, "secret", f"{env.name}-pull")
        auths = json.loads(base64.b64decode(pull["data"][".dockerconfigjson"]))["auths"]
        assert sorted(auths) == ["ghcr.io", "registry.example.com"]
        assert pull["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        await backend.delete(env)
        await until(lambda: left_over(pod_cluster) == NOTHING_LEFT)


async def test_a_job_container_that_cannot_run_fails_before_anything_is_made(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    text = SERVICES_WORKFLOW.replace(
        "    services:\n", "    container: {image: node:20, options: --user node}\n    services:\n"
    )
    async with kube_backend_factory() as backend:
        with pytest.raises(JobRefused) as refused:
            await backend.create(claimed(workflow=text, assignment_id=str(uuid.uuid4())))
        assert str(refused.value).startswith(
            "The job's `container:` cannot run in this pool: `container`: `--user node`"
        )
        assert left_over(pod_cluster) == NOTHING_LEFT


async def test_services_that_cannot_run_fail_before_anything_is_made(
    kube_backend_factory: BackendFactory, pod_cluster: Cluster
) -> None:
    clash = SERVICES_WORKFLOW + "      other:\n        image: valkey:8\n        ports: ['6379']\n"
    assignment = claimed(workflow=clash, assignment_id=str(uuid.uuid4()))
    async with kube_backend_factory() as backend:
        with pytest.raises(JobRefused) as refused:
            await backend.create(assignment)
        assert str(refused.value) == (
            "The job's `services:` cannot run in this pool: services `cache` and `other` both listen on port 6379"
        )
        assert left_over(pod_cluster) == NOTHING_LEFT
