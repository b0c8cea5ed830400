"""End to end on the kubernetes backend: the Gitea double, a real nats-server, the controller
in this process, and the Kubernetes API, scheduler/kubelet and SPIRE doubles running every Pod
as a real `dynrunner-executor` process that waits for its own SVID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynrunner.controller.config.model import ControllerConfig
from dynrunner.controller.demo import check, load_examples
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.kubernetes.cluster import Cluster
from tests.fixtures.demo_examples import EXAMPLES, follow_example, submit_examples
from tests.fixtures.harness import in_process, wait_for
from tests.fixtures.kubernetes_backend import NOTHING_LEFT, ObjectLog, kube_controller_data, left_over

NS = "ci-jobs"


def config(gitea: GiteaDouble, nats_url: str, cluster: Cluster, tmp_path: Path, **options: Any) -> ControllerConfig:
    kubeconfig = cluster.api.write_kubeconfig(tmp_path / "kubeconfig")
    data = kube_controller_data(
        gitea.url, gitea.registration_token, nats_url, kubeconfig, tmp_path / "state", **options
    )
    return ControllerConfig.model_validate(data)


async def test_the_demo_examples_run_in_pods_each_with_its_own_identity(
    gitea: GiteaDouble, nats_url: str, executor_cluster: Cluster, tmp_path: Path
) -> None:
    cfg = config(gitea, nats_url, executor_cluster, tmp_path, artifacts_dir=tmp_path / "artifacts", maxConcurrency=6)
    examples = load_examples(EXAMPLES)
    with ObjectLog(executor_cluster.api) as seen:
        async with in_process(cfg) as running:
            submit_examples(gitea, examples)
            for example in examples:
                await follow_example(gitea, example, within=120)
            await wait_for(
                lambda: not any(p.capacity.in_use for p in running.controller.pools.values()),
                within=30,
                what="every environment reaped",
            )
            waits = running.controller.metrics.sample("dynrunner_identity_wait_seconds_count", pool="pod")
        await wait_for(
            lambda: left_over(executor_cluster) == NOTHING_LEFT,
            within=20,
            what=f"nothing left (now {left_over(executor_cluster)})",
        )
    problems = {example.name: check(example) for example in examples}
    assert not any(problems.values()), (problems, {e.name: e.logs for e in examples if problems[e.name]})
    node_uid = executor_cluster.node_uid("node-a")
    jobs = [job for example in examples for job in example.jobs if job["task_id"]]
    assert waits == len(jobs), waits  # each executor's own figure, from its Pod's termination message
    missing = {
        name: [(v["type"], v["metadata"].get("annotations", {}).get("dynrunner.io/job-name")) for v in versions]
        for name, versions in seen.pods.items()
        if name not in seen.entries
    }
    assert len(seen.entries) == len(jobs) == len(seen.pods), missing
    for name, versions in seen.entries.items():
        entry, pod = versions[0], seen.pods[name][-1]
        assert entry["spec"]["parentID"] == f"spiffe://example.org/spire/agent/k8s_psat/ci/{node_uid}"
        assert entry["spec"]["selectors"] == [
            f"k8s:ns:{NS}",
            f"k8s:pod-uid:{pod['metadata']['uid']}",
            "k8s:container-name:executor",
        ]
        assert entry["spec"]["spiffeID"] == pod["metadata"]["annotations"]["dynrunner.io/spiffe-id"]
    for example in examples:
        for job in example.jobs:
            if not job["task_id"]:
                continue
            text = "\n".join(example.logs[job["name"]])
            assert f"Workload identity spiffe://example.org/ci/demo/{example.name}/" in text, text
            assert " issued after " in text
