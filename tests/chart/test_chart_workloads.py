"""What the chart runs: the controller Deployment (replicas, disruption budget, spread, probes on
the endpoints the controller serves, the replica's identity, a locked-down container), and the
executor namespace whose NetworkPolicy and Pod Security level fit the Pods the Kubernetes backend
really builds for a job (rendered with the backend's own `render`, from the chart's config)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from dynrunner.controller.config.model import load_config
from dynrunner.controller.infra.health import HealthServer
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.render import read_task, render
from tests.fixtures.chart import Chart, RenderError, container_files, find, one

TASK = """\
id: 42
context: {repository: acme/widgets, job: build, run_id: "100", run_number: "7", workflow: ci.yml}
workflowPayload: |
  on: push
  jobs:
    build:
      runs-on: [self-hosted, pod]
      steps: [{run: make}]
"""


@functools.cache
def rendered(chart: Chart, values: str) -> list[dict[str, Any]]:
    return chart.render([values])


def pod_spec(objects: list[dict[str, Any]], workload: str) -> dict[str, Any]:
    kind = "StatefulSet" if workload == "-nats" else "Deployment"
    spec: dict[str, Any] = one(objects, kind, workload)["spec"]["template"]["spec"]
    return spec


def pod_labels(objects: list[dict[str, Any]], workload: str) -> dict[str, str]:
    kind = "StatefulSet" if workload == "-nats" else "Deployment"
    labels: dict[str, str] = one(objects, kind, workload)["spec"]["template"]["metadata"]["labels"]
    return labels


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def job_pod(objects: list[dict[str, Any]], tmp_path: Path, pool: str = "pod") -> dict[str, Any]:
    """The Pod the Kubernetes backend creates for a job of `pool`, configured as the chart
    configures the controller."""
    files = container_files(objects, "-controller", "controller", tmp_path)
    task = tmp_path / "task.yaml"
    task.write_text(TASK)
    _, pod, *_ = yaml.safe_load_all(render(load_config(files.config, files.env), pool, read_task(task)))
    assert pod["kind"] == "Pod"
    return dict(pod)


# -- the controller ---------------------------------------------------------------------------


def test_the_controller_runs_two_replicas_on_different_nodes_and_survives_a_drain(chart: Chart) -> None:
    objects = rendered(chart, "ci/minimal-values.yaml")
    deployment = one(objects, "Deployment", "-controller")
    labels = pod_labels(objects, "-controller")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1},
    }
    pdb = one(objects, "PodDisruptionBudget", "-controller")
    assert pdb["spec"]["maxUnavailable"] == 1 and matches(pdb["spec"]["selector"], labels)
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    (term,) = pod_spec(objects, "-controller")["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert matches(term["podAffinityTerm"]["labelSelector"], labels)
    hard = pod_spec(rendered(chart, "ci/production-values.yaml"), "-controller")["affinity"]["podAntiAffinity"]
    assert list(hard) == ["requiredDuringSchedulingIgnoredDuringExecution"]
    assert one(rendered(chart, "ci/production-values.yaml"), "Deployment", "-controller")["spec"]["replicas"] == 3


def rollout(replicas: int, nodes: int, strategy: dict[str, Any]) -> bool:
    """Whether the Deployment controller's rolling update (maxSurge rounded up, maxUnavailable
    down, both 0 → 1 unavailable) completes when at most one replica fits on a node (hard
    anti-affinity) and `nodes` nodes are eligible: a Pod without a free node stays Pending."""

    def resolve(value: int | str, round_up: bool) -> int:
        if isinstance(value, int):
            return value
        share = replicas * int(value.rstrip("%"))
        return -(-share // 100) if round_up else share // 100

    if strategy["type"] == "Recreate":
        return replicas <= nodes
    rolling = strategy.get("rollingUpdate", {})
    surge = resolve(rolling.get("maxSurge", "25%"), round_up=True)
    unavailable = resolve(rolling.get("maxUnavailable", "25%"), round_up=False) or (0 if surge else 1)
    old, new_ready, new_pending = min(replicas, nodes), 0, 0
    for _ in range(10 * replicas + 10):
        if new_ready == replicas and old == 0:
            return True
        before = (old, new_ready, new_pending)
        new_pending += max(
            0, min(replicas + surge - (old + new_ready + new_pending), replicas - new_ready - new_pending)
        )
        old -= max(0, min(old, old + new_ready - (replicas - unavailable)))
        placed = min(new_pending, nodes - old - new_ready)
        new_pending, new_ready = new_pending - placed, new_ready + placed
        if (old, new_ready, new_pending) == before:
            return False
    return False


def test_an_upgrade_completes_with_hard_anti_affinity_and_no_spare_node(chart: Chart) -> None:
    """With `antiAffinity: hard` and as many replicas as eligible nodes, a surge Pod finds no
    node: the default strategy lets one old replica go first, so the upgrade completes (with
    maxUnavailable 0 it would wait forever)."""
    for replicas in (1, 2, 3, 5):
        objects = chart.render(["ci/production-values.yaml"], set={"controller.replicas": str(replicas)})
        spec = one(objects, "Deployment", "-controller")["spec"]
        assert (
            "requiredDuringSchedulingIgnoredDuringExecution" in spec["template"]["spec"]["affinity"]["podAntiAffinity"]
        )
        assert rollout(replicas, nodes=replicas, strategy=spec["strategy"]), spec["strategy"]
        assert rollout(replicas, nodes=replicas + 1, strategy=spec["strategy"])
    stuck = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert not rollout(3, nodes=3, strategy=stuck) and rollout(3, nodes=4, strategy=stuck)
    recreate = chart.render(
        ["ci/minimal-values.yaml"], overlay={"controller": {"updateStrategy": {"type": "Recreate"}}}
    )
    assert one(recreate, "Deployment", "-controller")["spec"]["strategy"] == {"type": "Recreate"}


def test_each_replica_knows_its_pod_name(chart: Chart) -> None:
    (container,) = pod_spec(rendered(chart, "ci/minimal-values.yaml"), "-controller")["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DYNRUNNER_REPLICA"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_the_container_is_locked_down(chart: Chart) -> None:
    spec = pod_spec(rendered(chart, "ci/minimal-values.yaml"), "-controller")
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/dynrunner", "/tmp"}
    assert container["resources"]["limits"]["memory"]
    assert spec["enableServiceLinks"] is False


async def test_the_probes_ask_what_the_controller_serves(chart: Chart) -> None:
    objects = rendered(chart, "ci/minimal-values.yaml")
    (container,) = pod_spec(objects, "-controller")["containers"]
    paths = {
        probe: container[probe]["httpGet"]["path"] for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert paths == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    assert {container[p]["httpGet"]["port"] for p in paths} == {"metrics"}
    (port,) = container["ports"]
    assert port["name"] == "metrics"
    assert one(objects, "Service", "-metrics")["spec"]["ports"][0]["targetPort"] == "metrics"
    not_ready = "not connected to NATS"
    server = HealthServer("127.0.0.1:0", Metrics(), lambda: (False, not_ready))
    async with server, aiohttp.ClientSession() as http:
        for probe, path in paths.items():
            async with http.get(server.url + path) as answer:
                body = await answer.text()
                expected = 503 if probe == "readinessProbe" else 200
                assert answer.status == expected, (probe, body)
        async with http.get(server.url + "/metrics") as answer:
            assert answer.status == 200


def test_the_metrics_service_scrapes_replicas_that_are_not_ready(chart: Chart) -> None:
    objects = rendered(chart, "ci/production-values.yaml")
    service = one(objects, "Service", "-metrics")
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert matches({"matchLabels": service["spec"]["selector"]}, pod_labels(objects, "-controller"))
    monitor = one(objects, "ServiceMonitor")
    assert matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert not matches(monitor["spec"]["selector"], one(objects, "Service", "-cache")["metadata"]["labels"])


# -- the jobs' namespace --------------------------------------------------------------------------


def test_the_executor_network_policy_applies_to_the_pods_the_backend_makes(chart: Chart, tmp_path: Path) -> None:
    objects = rendered(chart, "ci/minimal-values.yaml")
    pod = job_pod(objects, tmp_path)
    policy = one(objects, "NetworkPolicy", "-executors")
    assert policy["metadata"]["namespace"] == pod["metadata"]["namespace"] == "ci-jobs"
    assert matches(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert not matches(policy["spec"]["podSelector"], {**pod["metadata"]["labels"], "dynrunner.io/pool": "other"})
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["ingress"] == []
    dns, gitea = policy["spec"]["egress"]
    assert {"port": 53, "protocol": "UDP"} in dns["ports"]
    assert gitea == {"to": [{"ipBlock": {"cidr": "203.0.113.10/32"}}], "ports": [{"port": 443, "protocol": "TCP"}]}


def test_the_executor_network_policy_reaches_the_cache_the_store_and_the_internet_without_private_ranges(
    chart: Chart,
) -> None:
    objects = rendered(chart, "ci/production-values.yaml")
    _dns, gitea, store, cache, internet = one(objects, "NetworkPolicy", "-executors")["spec"]["egress"]
    assert gitea["ports"] == [{"port": 3000, "protocol": "TCP"}]
    assert store["ports"] == [{"port": 443, "protocol": "TCP"}]  # the port of artifacts.endpoint
    (peer,) = cache["to"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ci"}}
    assert matches(peer["podSelector"], pod_labels(objects, "-cache"))
    assert cache["ports"] == [{"port": 8089, "protocol": "TCP"}]
    (block,) = internet["to"]
    assert "169.254.0.0/16" in block["ipBlock"]["except"] and "10.0.0.0/8" in block["ipBlock"]["except"]


def test_jobs_resolve_names_through_nodelocal_dnscache_too(chart: Chart) -> None:
    """Clusters with NodeLocal DNSCache point Pods at 169.254.20.10 on their node, not at the
    kube-dns Pods: without it in the DNS rule every job would lose DNS (link-local addresses
    stay out of `internet`)."""
    dns = one(rendered(chart, "ci/minimal-values.yaml"), "NetworkPolicy", "-executors")["spec"]["egress"][0]
    assert {"ipBlock": {"cidr": "169.254.20.10/32"}} in dns["to"]
    assert any(
        "podSelector" in peer and peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"} for peer in dns["to"]
    )
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]


def test_the_api_servers_public_endpoint_can_be_kept_out_of_the_jobs_internet(chart: Chart) -> None:
    """With `internet` on, a public API server endpoint is reachable from every job unless its
    CIDRs are listed in `apiServer` (README, "Network")."""
    where = {"executorNetworkPolicy": {"apiServer": ["198.51.100.7/32"]}}
    egress = one(chart.render(["ci/production-values.yaml"], overlay=where), "NetworkPolicy", "-executors")["spec"]
    (block,) = egress["egress"][-1]["to"]
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert "198.51.100.7/32" in block["ipBlock"]["except"] and "10.0.0.0/8" in block["ipBlock"]["except"]
    assert all("198.51.100.7" not in str(rule) for rule in egress["egress"][:-1])


VM_POOL = {
    "name": "vm",
    "labels": ["self-hosted", "vm"],
    "backend": {"kind": "opensandbox", "url": "https://osb.example.com", "image": "registry.example.com/vm:1"},
}
POD_POOL = {"name": "pod", "labels": ["self-hosted", "pod"], "maxConcurrency": 100}


def test_the_jobs_pods_never_reach_the_opensandbox_server(chart: Chart) -> None:
    """Its proxy route opens a VM's execd to whoever knows the sandbox's id (issue 19 item 2):
    with a vm pool, the jobs' way to the internet leaves the server out, and the chart will not
    render one without knowing where the server is."""
    pools = {"config": {"pools": [POD_POOL, VM_POOL]}}
    with pytest.raises(RenderError, match=r"executorNetworkPolicy\.openSandbox is required"):
        chart.render(["ci/production-values.yaml"], overlay=pools)
    where = {**pools, "executorNetworkPolicy": {"openSandbox": ["203.0.113.20/32"]}}
    objects = chart.render(["ci/production-values.yaml"], overlay=where)
    egress = one(objects, "NetworkPolicy", "-executors")["spec"]["egress"]
    (block,) = egress[-1]["to"]
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0" and "203.0.113.20/32" in block["ipBlock"]["except"]
    assert all("203.0.113.20" not in str(rule) for rule in egress[:-1])


def test_the_pods_the_backend_makes_meet_the_namespaces_pod_security_level(chart: Chart, tmp_path: Path) -> None:
    """The namespace enforces the "restricted" Pod Security Standard; a job's Pod as the backend
    builds it must pass it, or every job would be refused at creation."""
    objects = rendered(chart, "ci/minimal-values.yaml")
    namespace = one(objects, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert restricted_violations(job_pod(objects, tmp_path)) == []


def test_a_jobs_pod_gets_the_workload_api_from_the_spiffe_csi_driver(chart: Chart, tmp_path: Path) -> None:
    """By default (kubernetesDefaults sets no workloadApiVolume) a job's Pod mounts the SPIFFE CSI
    driver's volume read-only and finds the agent's socket in it; a pool without identity
    mounts nothing of SPIFFE."""
    objects = rendered(chart, "ci/two-pools-values.yaml")
    pod = job_pod(objects, tmp_path / "pod")
    (csi,) = [v for v in pod["spec"]["volumes"] if "csi" in v]
    assert csi["csi"] == {"driver": "csi.spiffe.io", "readOnly": True}
    (container,) = pod["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == csi["name"]]
    assert mount["readOnly"] is True
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SPIFFE_ENDPOINT_SOCKET"].startswith(f"unix://{mount['mountPath']}/")
    without = job_pod(objects, tmp_path / "large", pool="large")
    assert not [v for v in without["spec"]["volumes"] if "csi" in v]
    assert "SPIFFE_ENDPOINT_SOCKET" not in {e["name"] for e in without["spec"]["containers"][0].get("env", [])}


def test_a_jobs_pod_is_not_best_effort_unless_the_admin_says_so(chart: Chart, tmp_path: Path) -> None:
    """Without resources a job's Pod is BestEffort: the first evicted under memory pressure, and
    scheduled as if it needed nothing. The chart's defaults request CPU and memory and limit
    memory; a pool's own keys win key by key, and `resources: null` leaves it to a LimitRange."""
    (container,) = job_pod(rendered(chart, "ci/minimal-values.yaml"), tmp_path / "default")["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    objects = rendered(chart, "ci/two-pools-values.yaml")
    (large,) = job_pod(objects, tmp_path / "large", pool="large")["spec"]["containers"]
    assert large["resources"] == {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"memory": "32Gi"}}
    override = {"config": {"pools": [{**POD_POOL, "backend": {"resources": {"limits": {"memory": "8Gi"}}}}]}}
    merged = chart.render(["ci/minimal-values.yaml"], overlay=override)
    (pod,) = job_pod(merged, tmp_path / "merged")["spec"]["containers"]
    assert pod["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "8Gi"}}
    none = chart.render(["ci/minimal-values.yaml"], overlay={"kubernetesDefaults": {"resources": None}})
    assert not job_pod(none, tmp_path / "none")["spec"]["containers"][0].get("resources")


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The checks of the "restricted" Pod Security Standard (Kubernetes' pod-security-admission
    policies, restricted profile) that a Pod fails."""
    spec, found = pod["spec"], []
    pod_context = spec.get("securityContext") or {}
    allowed_volumes = {
        "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
    }  # fmt: skip
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= allowed_volumes:
            found.append(f"volume {volume['name']} is {kinds}")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            found.append(flag)
    for container in spec.get("initContainers", []) + spec["containers"]:
        context = container.get("securityContext") or {}
        name = container["name"]
        if context.get("privileged"):
            found.append(f"{name} privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name} may escalate privileges")
        if context.get("capabilities", {}).get("drop") != ["ALL"]:
            found.append(f"{name} keeps capabilities")
        if set(context.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name} adds capabilities")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            found.append(f"{name} may run as root")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"{name} runs as uid 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile")) or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name} has no seccomp profile")
        if any(p.get("hostPort") for p in container.get("ports", [])):
            found.append(f"{name} uses a host port")
    return found


# -- the bundled NATS ----------------------------------------------------------------------------


def test_only_the_controllers_may_connect_to_the_bundled_nats(chart: Chart) -> None:
    objects = rendered(chart, "ci/minimal-values.yaml")
    policy = one(objects, "NetworkPolicy", "-nats")
    assert matches(policy["spec"]["podSelector"], pod_labels(objects, "-nats"))
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert matches(peer["podSelector"], pod_labels(objects, "-controller"))
    assert not matches(peer["podSelector"], pod_labels(rendered(chart, "ci/production-values.yaml"), "-cache"))
    assert rule["ports"] == [{"port": 4222, "protocol": "TCP"}]
    service = one(objects, "Service", "-nats")
    assert matches({"matchLabels": service["spec"]["selector"]}, pod_labels(objects, "-nats"))
    statefulset = one(objects, "StatefulSet", "-nats")
    assert statefulset["spec"]["replicas"] == 1
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"


@pytest.mark.parametrize("values", ["ci/production-values.yaml", "ci/external-nats-values.yaml"])
def test_no_bundled_nats_with_an_external_one(chart: Chart, values: str) -> None:
    objects = rendered(chart, values)
    assert not find(objects, "StatefulSet") and not find(objects, "Service", "-nats")
