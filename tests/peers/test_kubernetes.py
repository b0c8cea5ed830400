"""The `kubernetes` backend end to end against a real control plane: etcd 3.6,
kube-apiserver and kube-controller-manager 1.34 (tests/fixtures/real_kubernetes.py).

The controller talks to the real API server as the group-less user `dynrunner`, bound to
exactly what the code declares (the file the chart renders its Role and ClusterRole from);
each test's jobs run in a namespace of their own that PodSecurity enforces at `restricted`.
Our kubelet double (`dynrunner.doubles.kubernetes.remote`, bound to the real API server) is
the one double in the Pod flow: it binds each Pod to its node and runs the executor as a
local process. Gitea is the Gitea double (the real Gitea tier is test_gitea_examples.py).
Pools run without identity here: the ClusterStaticEntry → SPIRE entry path needs the real
spire-controller-manager (docs/real-peers.md).
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from dynrunner.controller.config.model import ControllerConfig
from dynrunner.controller.demo import check, load_examples
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.gitea.views import RunView
from dynrunner.doubles.kubernetes.remote import RemoteNode
from tests.fixtures.demo_examples import EXAMPLES, follow_example, submit_examples
from tests.fixtures.harness import (
    Subprocess,
    first_job_log,
    in_process,
    recorded,
    recording_workflow,
    wait_for,
    wait_run_done,
)
from tests.fixtures.kubernetes_backend import kube_controller_data, sleepy_workflow
from tests.fixtures.real_kubernetes import USER_TOKENS, Gate, RealIdentity, RealKube, grant_controller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
_numbers = itertools.count(1)


@pytest.fixture
def namespace(real_kube: RealKube, real_node: RemoteNode) -> Iterator[str]:
    """A namespace of this test's own, `restricted`, where `dynrunner` has the declared rights."""
    name = f"ci-{next(_numbers)}-{uuid.uuid4().hex[:6]}"
    real_kube.namespace(name, enforce="restricted")
    grant_controller(real_kube, name)
    yield name
    real_kube.request("DELETE", f"/api/v1/namespaces/{name}")


def config_data(
    gitea: GiteaDouble, nats_url: str, kube: RealKube, namespace: str, tmp_path: Path, *, url: str = "", **backend: Any
) -> dict[str, Any]:
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig", token=USER_TOKENS["dynrunner"], namespace=namespace)
    if url:
        text = kubeconfig.read_text().replace(kube.url, url)
        kubeconfig.write_text(text)
    backend = {"identity": False, "namespace": namespace, **backend}
    return kube_controller_data(
        gitea.url, gitea.registration_token, nats_url, kubeconfig, tmp_path / "state", **backend
    )


def left(kube: RealKube, namespace: str) -> dict[str, list[str]]:
    """The Pods and the controller's Secrets left in `namespace`."""
    out: dict[str, list[str]] = {}
    for kind in ("pods", "secrets"):
        items = kube.request("GET", f"/api/v1/namespaces/{namespace}/{kind}").json()["items"]
        out[kind] = [
            i["metadata"]["name"]
            for i in items
            if (i["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "dynrunner"
        ]
    return out


NOTHING = {"pods": [], "secrets": []}


def _requests(kube: RealKube, since: float) -> list[dict[str, Any]]:
    """The controller's API requests (audit events) since `since` (epoch seconds)."""
    return [event for event in kube.audit_requests("dynrunner") if _stamp(event) >= since]


def _what(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
    return f"{event['verb']} {ref.get('resource', event['requestURI'])}{sub}"


async def test_the_demo_examples_run_in_pods_admitted_as_restricted(
    gitea: GiteaDouble, nats_url: str, real_kube: RealKube, namespace: str, tmp_path: Path
) -> None:
    """Every demo example but `artifacts` (its Filesystem store is a hostPath volume in the
    double's e2e, which PodSecurity `baseline` and `restricted` refuse) ends as its
    expectations say; every Pod and Secret is gone afterwards; the controller's API requests
    per job, counted from the API server's audit log, are reported and bounded."""
    examples = [e for e in load_examples(EXAMPLES) if e.name != "artifacts"]
    cfg = ControllerConfig.model_validate(
        config_data(gitea, nats_url, real_kube, namespace, tmp_path, maxConcurrency=6)
    )
    async with in_process(cfg) as running:
        started = time.time()
        submit_examples(gitea, examples)
        for example in examples:
            await follow_example(gitea, example, within=180)
        await wait_for(
            lambda: not any(p.capacity.in_use for p in running.controller.pools.values()), within=60, what="reaped"
        )
        await wait_for(lambda: left(real_kube, namespace) == NOTHING, within=60, what="nothing left")
        ended = time.time()
    problems = {example.name: check(example) for example in examples}
    assert not any(problems.values()), (problems, {e.name: e.logs for e in examples if problems[e.name]})
    jobs = sum(1 for example in examples for job in example.jobs if job["task_id"])
    calls = [e for e in _requests(real_kube, started) if _stamp(e) <= ended]
    per_job = len(calls) / jobs
    counts = Counter(_what(e) for e in calls)
    print(f"\nAPI requests of the controller for {jobs} jobs: {len(calls)} ({per_job:.1f} per job): {dict(counts)}")
    refused = [e for e in calls if (e.get("responseStatus") or {}).get("code", 200) == 403]
    assert not refused, [(_what(e), e["responseStatus"]) for e in refused]  # the declared rights suffice
    assert per_job <= 8, dict(counts)


def _stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()


def _pod_of(kube: RealKube, namespace: str) -> dict[str, Any] | None:
    items = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods").json()["items"]
    return items[0] if items else None


def _the_pod(kube: RealKube, namespace: str) -> dict[str, Any]:
    pod = _pod_of(kube, namespace)
    assert pod is not None, f"no Pod in {namespace}"
    return pod


async def _started(gitea: GiteaDouble, seconds: float) -> RunView:
    """A job that sleeps `seconds`, once it printed that it started."""
    run = gitea.submit("acme/app", sleepy_workflow(seconds))
    await wait_for(lambda: "job started" in first_job_log(gitea, run.id), within=90, what="the job to run")
    return run


async def _failed_saying(gitea: GiteaDouble, run_id: int, reason: str, kube: RealKube, namespace: str) -> None:
    """The run failed with `reason` in its job's log, and nothing of it is left in `namespace`."""
    done = await wait_run_done(gitea, run_id, within=90)
    text = first_job_log(gitea, run_id)
    assert done.status == "failure", text
    assert reason in text, text
    await wait_for(lambda: left(kube, namespace) == NOTHING, within=60, what="nothing left")


async def test_a_pod_deleted_by_hand_fails_its_job_with_the_reason(
    gitea: GiteaDouble, nats_url: str, real_kube: RealKube, namespace: str, tmp_path: Path
) -> None:
    cfg = ControllerConfig.model_validate(config_data(gitea, nats_url, real_kube, namespace, tmp_path))
    async with in_process(cfg):
        run = await _started(gitea, 120)
        pod = _the_pod(real_kube, namespace)
        answer = real_kube.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}", json={"gracePeriodSeconds": 0}
        )
        assert answer.status_code == 200, answer.text
        reason = "the job's Pod was deleted by someone other than the controller"
        await _failed_saying(gitea, run.id, reason, real_kube, namespace)


async def test_an_image_that_cannot_be_pulled_fails_the_job_with_the_reason(
    gitea: GiteaDouble, nats_url: str, real_kube: RealKube, namespace: str, tmp_path: Path
) -> None:
    data = config_data(
        gitea, nats_url, real_kube, namespace, tmp_path, image="registry.example/nope:1", imagePullTimeoutSeconds=1
    )
    async with in_process(ControllerConfig.model_validate(data)):
        run = gitea.submit("acme/app", sleepy_workflow(1))
        reason = "[dynrunner] the job failed: the executor image registry.example/nope:1 could not be pulled ("
        await _failed_saying(gitea, run.id, reason, real_kube, namespace)


async def test_an_oom_killed_job_is_finalized_with_the_reason(
    gitea: GiteaDouble, nats_url: str, real_kube: RealKube, real_node: RemoteNode, namespace: str, tmp_path: Path
) -> None:
    data = config_data(gitea, nats_url, real_kube, namespace, tmp_path, resources={"limits": {"memory": "512Mi"}})
    async with in_process(ControllerConfig.model_validate(data)):
        run = await _started(gitea, 120)
        real_node.oom_kill(namespace, _the_pod(real_kube, namespace)["metadata"]["name"])
        reason = "the job ran out of memory (memory limit 512Mi): the executor was OOMKilled"
        await _failed_saying(gitea, run.id, reason, real_kube, namespace)


async def test_the_secret_is_collected_by_the_garbage_collector_through_its_owner(
    gitea: GiteaDouble, nats_url: str, real_kube: RealKube, namespace: str, tmp_path: Path
) -> None:
    """With no controller running, the job's Pod deleted: kube-controller-manager's garbage
    collector deletes the job's Secret (its ownerReference names the Pod)."""
    cfg = ControllerConfig.model_validate(config_data(gitea, nats_url, real_kube, namespace, tmp_path))
    async with in_process(cfg):
        await _started(gitea, 120)
    pod = _the_pod(real_kube, namespace)
    secret = real_kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{pod['metadata']['name']}").json()
    owners = secret["metadata"].get("ownerReferences") or []
    assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [
        ("Pod", pod["metadata"]["name"], pod["metadata"]["uid"])
    ], secret["metadata"]
    real_kube.request(
        "DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}", json={"gracePeriodSeconds": 0}
    )
    await wait_for(lambda: left(real_kube, namespace) == NOTHING, within=60, what="the Secret collected")


async def test_a_watch_cut_while_the_pod_ended_resumes_after_compaction_and_reaps_it(
    gitea: GiteaDouble, nats_url: str, real_kube: RealKube, namespace: str, tmp_path: Path
) -> None:
    """The controller's connection to the API server is cut; meanwhile the job's Pod ends and
    etcd is compacted. Its watch resumes from a version compacted away: 410, a new list, and
    the ended Pod is reaped (deleted, with its Secret) — its end is not missed."""
    gate = Gate(real_kube.port)
    try:
        data = config_data(gitea, nats_url, real_kube, namespace, tmp_path, url=gate.url)
        cfg = ControllerConfig.model_validate(data)
        async with in_process(cfg) as running:
            run = await _started(gitea, 4)
            gate.close()
            cut = time.time()
            await wait_for(
                lambda: (_pod_of(real_kube, namespace) or {}).get("status", {}).get("phase") == "Succeeded",
                within=60,
                what="the Pod to end",
            )
            revision = real_kube.compact()
            compacted = time.time()
            gate.open()
            await wait_for(lambda: left(real_kube, namespace) == NOTHING, within=90, what="the ended Pod reaped")
            await wait_for(
                lambda: not any(p.capacity.in_use for p in running.controller.pools.values()), within=30, what="free"
            )
        done = await wait_run_done(gitea, run.id, within=30)
        assert done.status == "success", first_job_log(gitea, run.id)
        events = [e for e in _requests(real_kube, compacted) if (e.get("objectRef") or {}).get("resource") == "pods"]
        after = [_what(e) for e in events]
        # The watch resumed from a version etcd compacted away (answered 410 Gone in its
        # stream), then a new list, then the ended Pod deleted.
        assert after[:3] == ["watch pods", "list pods", "delete pods"], after
        resumed = parse_qs(urlsplit(events[0]["requestURI"]).query)["resourceVersion"][0]
        assert int(resumed) < revision, (resumed, revision)
        assert cut < compacted
    finally:
        gate.stop()


async def test_a_controller_killed_twice_mid_run_ends_every_job_once(
    gitea: GiteaDouble, nats_url: str, real_kube: RealKube, namespace: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.log"
    data = config_data(gitea, nats_url, real_kube, namespace, tmp_path, maxConcurrency=3)
    data["nats"]["ackWaitSeconds"] = 2.0
    controller = Subprocess(data, tmp_path)
    run = gitea.submit("owner/repo", recording_workflow(ran, 6, sleep=1.0))
    try:
        controller.start()
        for started in (2, 4):
            await wait_for(lambda n=started: len(recorded(ran)) >= n, within=120, what=f"{started} jobs started")
            controller.kill()
            controller.start()
        done = await wait_run_done(gitea, run.id, within=180)
        await wait_for(lambda: left(real_kube, namespace) == NOTHING, within=60, what="nothing left")
        assert await controller.terminate() == 0
    finally:
        if controller.proc is not None and controller.proc.poll() is None:
            with contextlib.suppress(Exception):
                controller.kill()
    assert done.status == "success", controller.log()[-3000:]
    counts = Counter(recorded(ran))
    assert len(counts) == 6 and max(counts.values()) == 1, counts


async def test_each_jobs_cluster_static_entry_becomes_an_entry_on_the_real_spire_server(
    gitea: GiteaDouble,
    nats_url: str,
    real_kube: RealKube,
    real_identity: RealIdentity,
    real_node: RemoteNode,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The real spire-controller-manager turns the job's ClusterStaticEntry into an entry on the
    real spire-server: SPIFFE ID, the node's agent as parent, the Pod's selectors, the TTL; and
    deletes it once the job's Pod and entry are gone. (No agent attests the Pod here, so the
    executor's wait for its SVID ends the job.)"""
    data = config_data(gitea, nats_url, real_kube, namespace, tmp_path, identity=True)
    data["identity"]["svidTimeoutSeconds"] = 15
    cfg = ControllerConfig.model_validate(data)
    async with in_process(cfg):
        run = gitea.submit("acme/app", sleepy_workflow(1))

        def ours() -> list[dict[str, Any]]:
            return [e for e in real_identity.entries() if e["spiffe_id"]["path"] == "/ci/acme/app/build"]

        entries = await wait_for(ours, within=90, what="the job's SPIRE entry")
        pod = _the_pod(real_kube, namespace)
        entry = entries[0]
        assert entry["id"].startswith("rp."), entry
        assert entry["spiffe_id"]["trust_domain"] == "example.org"
        assert entry["parent_id"] == {
            "trust_domain": "example.org",
            "path": f"/spire/agent/k8s_psat/ci/{real_node.node_uid}",
        }
        assert sorted((s["type"], s["value"]) for s in entry["selectors"]) == [
            ("k8s", "container-name:executor"),
            ("k8s", f"ns:{namespace}"),
            ("k8s", f"pod-uid:{pod['metadata']['uid']}"),
        ]
        assert entry["x509_svid_ttl"] == 900
        done = await wait_run_done(gitea, run.id, within=90)
        text = first_job_log(gitea, run.id)
        assert "workload identity spiffe://example.org/ci/acme/app/build not issued within 15s" in text
        assert done.status == "failure"
        await wait_for(lambda: not ours(), within=60, what="the entry deleted with the Pod")
