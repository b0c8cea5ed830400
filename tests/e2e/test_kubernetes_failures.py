"""End to end on the kubernetes backend when things go wrong: a Pod that cannot start or dies
under its job, a Pod deleted by hand, an identity that never comes, an invalid job key —
each task is finalized once with the reason in its log, and nothing is left in the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client

from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.kubernetes.cluster import Cluster
from dynrunner.doubles.spire.double import SpireOptions
from dynrunner.proto.accepted import decode
from dynrunner.proto.gitea import Result
from tests.fixtures.harness import first_job_log, in_process, wait_for, wait_run_done
from tests.fixtures.kubernetes import api_client
from tests.fixtures.kubernetes_backend import (
    ObjectLog,
    all_reaped,
    executor_cluster_options,
    kube_controller_data,
    sleepy_workflow,
)

NS = "ci-jobs"
QUICK = "on: push\njobs:\n  build:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: echo quick\n"


def config(gitea: GiteaDouble, nats_url: str, cluster: Cluster, tmp_path: Path, **options: Any) -> ControllerConfig:
    kubeconfig = cluster.api.write_kubeconfig(tmp_path / "kubeconfig")
    identity = options.pop("identity_options", {})
    data = kube_controller_data(gitea.url, gitea.registration_token, nats_url, kubeconfig, tmp_path / "s", **options)
    data["identity"].update(identity)
    return ControllerConfig.model_validate(data)


async def failed_with(gitea: GiteaDouble, run_id: int, *needles: str) -> str:
    done = await wait_run_done(gitea, run_id, within=90)
    text = first_job_log(gitea, run_id)
    assert done.status == "failure", text
    for needle in needles:
        assert needle in text, text
    assert gitea.task(done.jobs[0].task_id).log_archived
    return text


async def running_job(gitea: GiteaDouble, run_id: int) -> None:
    await wait_for(lambda: "job started" in first_job_log(gitea, run_id), within=60, what="the job to run")


async def test_an_image_that_cannot_be_pulled_fails_the_job_with_the_reason(
    gitea: GiteaDouble, nats_url: str, executor_cluster: Cluster, tmp_path: Path
) -> None:
    cfg = config(
        gitea, nats_url, executor_cluster, tmp_path, image="registry.example/nope:1", imagePullTimeoutSeconds=1
    )
    async with in_process(cfg) as running:
        run = gitea.submit("acme/app", QUICK)
        await failed_with(
            gitea,
            run.id,
            "[dynrunner] the job failed: the executor image registry.example/nope:1 could not be pulled (",
            "[start-failed]",
        )
        await all_reaped(executor_cluster, running)
        assert (
            running.controller.metrics.sample("dynrunner_finalized_failed_total", pool="pod", reason="start-failed")
            == 1.0
        )


async def test_an_oom_killed_job_is_finalized_with_the_reason(
    gitea: GiteaDouble, nats_url: str, executor_cluster: Cluster, tmp_path: Path
) -> None:
    cfg = config(gitea, nats_url, executor_cluster, tmp_path, resources={"limits": {"memory": "512Mi"}})
    async with in_process(cfg) as running:
        run = gitea.submit("acme/app", sleepy_workflow(60))
        await running_job(gitea, run.id)
        name = next(iter(_pods(executor_cluster)))
        executor_cluster.oom_kill(NS, name)
        await failed_with(
            gitea,
            run.id,
            "[dynrunner] the job failed: the job ran out of memory (memory limit 512Mi): the executor was OOMKilled",
        )
        await all_reaped(executor_cluster, running)


TWO_STEPS = """
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    steps:
      - run: echo "built"
      - run: |
          echo "job started"
          sleep 60
      - run: echo never
"""


async def test_a_pod_killed_after_its_first_step_shows_that_step_succeeded(
    gitea: GiteaDouble, nats_url: str, executor_cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 18 item 7: the reaper finalizes with the steps Gitea last accepted, which the
    executor kept as its termination message and the kubelet read when it killed it: step 1
    succeeded, step 2 was cancelled, step 3 never ran (not every step cancelled)."""
    cfg = config(gitea, nats_url, executor_cluster, tmp_path, resources={"limits": {"memory": "512Mi"}})
    async with in_process(cfg) as running:
        run = gitea.submit("acme/app", TWO_STEPS)
        await running_job(gitea, run.id)
        name = next(iter(_pods(executor_cluster)))
        await wait_for(lambda: second_step_kept(executor_cluster, name), what="the second step's start accepted")
        executor_cluster.oom_kill(NS, name)
        await failed_with(gitea, run.id, "the executor was OOMKilled")
        task = gitea.task(gitea.run(run.id).jobs[0].task_id)
        assert [step.status for step in task.steps] == ["success", "cancelled", "skipped"], task.steps
        first, second, _ = task.steps
        assert "built" in task.log_rows[first.log_index : first.log_index + first.log_length]
        assert 0 < second.started <= second.stopped
        await all_reaped(executor_cluster, running)


def second_step_kept(cluster: Cluster, name: str) -> bool:
    """The executor's termination message (the file the kubelet reads at the container's end)
    holds step 1 succeeded and step 2 started."""
    with api_client(cluster.api) as api:
        uid = client.CoreV1Api(api).read_namespaced_pod(name, NS).metadata.uid
    for kubelet in cluster.kubelets.values():
        message = kubelet.options.root / "pods" / uid / "termination" / "executor"
        state = decode(message.read_text()) if message.exists() else None
        if state is not None and len(state.steps) > 1 and state.steps[1].started_at is not None:
            return state.steps[0].result is Result.SUCCESS
    return False


async def test_a_pod_deleted_by_hand_ends_its_job_at_once(
    gitea: GiteaDouble, nats_url: str, executor_cluster: Cluster, tmp_path: Path
) -> None:
    """Gracefully: the executor gets SIGTERM and reports the job stopped. Forcibly (grace 0, the
    executor killed at once): the controller finalizes the task with the reason. Either way no
    task waits for Gitea's zombie reaper."""
    cfg = config(gitea, nats_url, executor_cluster, tmp_path)
    async with in_process(cfg) as running:
        gentle, forced = gitea.submit("acme/app", sleepy_workflow(60)), gitea.submit("acme/lib", sleepy_workflow(60))
        await running_job(gitea, gentle.id)
        await running_job(gitea, forced.id)
        names = {_pods(executor_cluster)[name]: name for name in _pods(executor_cluster)}
        with api_client(executor_cluster.api) as api:
            core = client.CoreV1Api(api)
            core.delete_namespaced_pod(names["acme/app"], NS, grace_period_seconds=5)
            core.delete_namespaced_pod(names["acme/lib"], NS, grace_period_seconds=0)
        await failed_with(gitea, gentle.id, "The runner's environment is shutting down; the job was stopped.")
        await failed_with(
            gitea,
            forced.id,
            "[dynrunner] the job failed: the job's Pod was deleted by someone other than the controller",
        )
        await all_reaped(executor_cluster, running)


def _pods(cluster: Cluster) -> dict[str, str]:
    """Pod name → the repository of its job."""
    with api_client(cluster.api) as api:
        pods = client.CoreV1Api(api).list_namespaced_pod(NS).items
    return {p.metadata.name: p.metadata.annotations["dynrunner.io/repository"] for p in pods}


async def test_an_identity_that_is_not_issued_in_time_fails_the_job(
    gitea: GiteaDouble, nats_url: str, kube_cluster_factory: Any, tmp_path: Path
) -> None:
    options = executor_cluster_options(tmp_path, spire=SpireOptions(issue_delay=30))
    with kube_cluster_factory(**options) as cluster:
        cfg = config(gitea, nats_url, cluster, tmp_path, identity_options={"svidTimeoutSeconds": 1})
        async with in_process(cfg) as running:
            run = gitea.submit("acme/app", QUICK)
            text = await failed_with(
                gitea, run.id, "##[error]workload identity spiffe://example.org/ci/acme/app/build not issued within 1s"
            )
            assert "quick" not in text.split("not issued within")[1]
            await all_reaped(cluster, running)


async def test_an_invalid_job_key_fails_without_a_pod(
    gitea: GiteaDouble, nats_url: str, executor_cluster: Cluster, tmp_path: Path
) -> None:
    bad = "on: push\njobs:\n  9lives:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: echo\n"
    cfg = config(gitea, nats_url, executor_cluster, tmp_path)
    with ObjectLog(executor_cluster.api) as seen:
        async with in_process(cfg) as running:
            run = gitea.submit("acme/app", bad)
            ok = gitea.submit("acme/app", QUICK)
            await failed_with(gitea, run.id, "job id '9lives' is not a valid job key: it must match")
            assert (await wait_run_done(gitea, ok.id)).status == "success"
            await all_reaped(executor_cluster, running)
    assert len(seen.pods) == 1 and len(seen.entries) == 1  # the valid job's only
