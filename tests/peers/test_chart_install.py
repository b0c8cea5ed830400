"""The chart installed for real: `helm install` (the Helm the chart tests pin) into the real
control plane of tests/fixtures/real_kubernetes.py, after spire-controller-manager's CRDs
(from its build, tests/fixtures/peers.py) — what a cluster admin does.

Every object of the chart is admitted by a real API server (schemas, RBAC objects,
PodSecurity labels); the controller then runs with the token of the chart's ServiceAccount
(TokenRequest), not an admin token, and a job's Pod runs in the chart's `restricted`
namespace. No Deployment, StatefulSet or NetworkPolicy is acted on here: the controller
manager runs only the garbage collector and the namespace and service-account controllers.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.kubernetes.remote import RemoteNode
from tests.fixtures.chart import CHART
from tests.fixtures.harness import in_process, wait_for, wait_run_done
from tests.fixtures.kubernetes_backend import kube_controller_data
from tests.fixtures.peers import built, why_not_built
from tests.fixtures.real_kubernetes import PERMISSIONS, RealKube

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
# The Prometheus Operator's kinds production-values.yaml renders (open schemas: not ours to check).
MONITORING = {
    "ServiceMonitor": "servicemonitors",
    "PrometheusRule": "prometheusrules",
}
QUICK = "on: push\njobs:\n  build:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: echo hi\n"
EVERY_USER = {
    # What system:basic-user and system:discovery grant every authenticated user.
    ("authorization.k8s.io", "selfsubjectaccessreviews", "create", ""),
    ("authorization.k8s.io", "selfsubjectrulesreviews", "create", ""),
    ("authentication.k8s.io", "selfsubjectreviews", "create", ""),
}


@pytest.fixture(scope="session")
def cluster_ready(real_kube: RealKube, real_node: RemoteNode) -> RemoteNode:
    """spire-controller-manager's CRDs and the Prometheus Operator's kinds applied."""
    scm = built("spire-controller-manager", "0.6")
    if scm is None:
        pytest.skip(why_not_built("spire-controller-manager", "0.6"))
    for path in sorted((scm.static / "bases").glob("*.yaml")):
        real_kube.apply(yaml.safe_load(path.read_text()))
    for kind, plural in MONITORING.items():
        real_kube.apply(_open_crd("monitoring.coreos.com", "v1", kind, plural))
    real_kube.apply(
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "ci-jobs"}, "value": 10}
    )
    for name in (*(f"{p}.monitoring.coreos.com" for p in MONITORING.values()), "clusterstaticentries.spire.spiffe.io"):
        _established(real_kube, name)
    return real_node


def _open_crd(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def _established(kube: RealKube, name: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}").json()
        conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        if conditions.get("Established") == "True":
            return
        time.sleep(0.2)
    raise AssertionError(f"CRD {name} not established")


class Helm:
    def __init__(self, binary: Path, kube: RealKube, home: Path) -> None:
        self.binary, self.kube, self.home = binary, kube, home
        self.kubeconfig = kube.kubeconfig(home / "admin.kubeconfig")

    def __call__(self, *args: str) -> str:
        env = {"HOME": str(self.home), "PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": str(self.home / "cache")}
        done = subprocess.run(
            [str(self.binary), *args, "--kubeconfig", str(self.kubeconfig)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
        return done.stdout


@pytest.fixture
def helm_cli(helm: Path, real_kube: RealKube, tmp_path: Path) -> Helm:
    return Helm(helm, real_kube, tmp_path)


def _secret(kube: RealKube, namespace: str, name: str, data: dict[str, str]) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": data,
        }
    )


def _rules(review: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    out = set()
    for rule in review["status"]["resourceRules"]:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                for verb in rule.get("verbs") or []:
                    for name in rule.get("resourceNames") or [""]:
                        out.add((group, resource, verb, name))
    return out


def _declared(*namespaces: str) -> set[tuple[str, str, str, str]]:
    """The declared rules as a rules review of the first namespace shows them: its Role's,
    and the ClusterRole's, whose `{namespace}` stands for every pool namespace."""
    declared = yaml.safe_load(PERMISSIONS.read_text())
    cluster = declared["clusterRole"] + declared.get("identityClusterRole", [])  # a pool has identity
    for rule in cluster:
        if rule.get("resourceNames") == ["{namespace}"]:
            rule["resourceNames"] = list(namespaces)
    return _rules({"status": {"resourceRules": declared["role"] + cluster}})


def _token(kube: RealKube, namespace: str, account: str) -> str:
    answer = kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["status"]["token"])


def _granted(kube: RealKube, token: str, namespace: str) -> set[tuple[str, str, str, str]]:
    review = kube.request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        token=token,
        json={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": namespace},
        },
    )
    assert review.status_code == 201, review.text
    return _rules(review.json()) - EVERY_USER


async def test_the_production_values_install_and_the_controller_runs_with_the_charts_token(
    cluster_ready: RemoteNode, helm_cli: Helm, real_kube: RealKube, gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    """`helm install` with ci/production-values.yaml; the chart's ServiceAccount token (a
    TokenRequest) has exactly the declared rights in the executor namespace; a job's Pod,
    Secret and ClusterStaticEntry are made with it in the `restricted` namespace the chart
    made, and all three are gone afterwards."""
    ns = "dynrunner"
    real_kube.namespace(ns, enforce="restricted")
    for name, data in {
        "gitea-runner-token": {"token": "t" * 40},
        "dynrunner-sealing": {"sealing.key": "A" * 43 + "="},
        "dynrunner-sealing-2025": {"sealing.key": "B" * 43 + "="},
        "nats-dynrunner": {"password": "p"},
        "nats-client-tls": {"ca.crt": "x", "tls.crt": "x", "tls.key": "x"},
    }.items():
        _secret(real_kube, ns, name, data)
    helm_cli("install", "ci", str(CHART), "-n", ns, "-f", str(CHART / "ci" / "production-values.yaml"))
    jobs_ns = f"{ns}-jobs"
    labels = real_kube.request("GET", f"/api/v1/namespaces/{jobs_ns}").json()["metadata"]["labels"]
    assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", labels
    account = "ci-dynrunner-controller"
    token = _token(real_kube, ns, account)
    granted = _granted(real_kube, token, jobs_ns)
    assert granted == _declared(jobs_ns), sorted(granted ^ _declared(jobs_ns))

    kubeconfig = real_kube.kubeconfig(tmp_path / "sa.kubeconfig", token=token, namespace=jobs_ns)
    data = kube_controller_data(
        gitea.url, gitea.registration_token, nats_url, kubeconfig, tmp_path / "state", namespace=jobs_ns
    )
    data["identity"] = {"trustDomain": "ci.example.com", "cluster": "production", "svidTimeoutSeconds": 5}
    started = time.time()
    async with in_process(ControllerConfig.model_validate(data)) as running:
        run = gitea.submit("acme/app", QUICK)
        done = await wait_run_done(gitea, run.id, within=120)
        log = "\n".join(gitea.task(done.jobs[0].task_id).log_rows)
        # No SPIRE agent here: the executor ran in its Pod and waited for its SVID in vain.
        assert "workload identity spiffe://ci.example.com/ci/acme/app/build not issued within 5s" in log, log
        await wait_for(
            lambda: not any(p.capacity.in_use for p in running.controller.pools.values()), within=60, what="reaped"
        )
    user = f"system:serviceaccount:{ns}:{account}"
    calls = [e for e in real_kube.audit_requests(user) if e["requestReceivedTimestamp"] >= _iso(started)]
    made = {(e["verb"], (e.get("objectRef") or {}).get("resource")) for e in calls}
    assert {("create", "pods"), ("create", "secrets"), ("create", "clusterstaticentries")} <= made, made
    refused = [(e["verb"], e["requestURI"]) for e in calls if (e.get("responseStatus") or {}).get("code") == 403]
    assert not refused, refused
    await wait_for(lambda: _none_left(real_kube, jobs_ns), within=60, what="no Pod, Secret or entry left")


def _none_left(kube: RealKube, namespace: str) -> bool:
    """No Pod, no Secret of the controller in `namespace`, no ClusterStaticEntry (a Pod the
    controller deleted stays until its kubelet ends it)."""
    paths = [
        f"/api/v1/namespaces/{namespace}/pods",
        f"/api/v1/namespaces/{namespace}/secrets?labelSelector=app.kubernetes.io/managed-by%3Ddynrunner",
        "/apis/spire.spiffe.io/v1alpha1/clusterstaticentries",
    ]
    return all(kube.request("GET", path).json()["items"] == [] for path in paths)


def _iso(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp))


def _ours(kube: RealKube, release: str) -> list[str]:
    """Every object labelled as this release's, of the kinds the chart makes."""
    selector = f"app.kubernetes.io/instance={release}"
    paths = [
        "/api/v1/namespaces",
        "/api/v1/secrets",
        "/api/v1/configmaps",
        "/api/v1/serviceaccounts",
        "/api/v1/services",
        "/api/v1/persistentvolumeclaims",
        "/apis/apps/v1/deployments",
        "/apis/apps/v1/statefulsets",
        "/apis/policy/v1/poddisruptionbudgets",
        "/apis/networking.k8s.io/v1/networkpolicies",
        "/apis/rbac.authorization.k8s.io/v1/roles",
        "/apis/rbac.authorization.k8s.io/v1/rolebindings",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    ]
    out = []
    for path in paths:
        for item in kube.request("GET", f"{path}?labelSelector={selector}").json()["items"]:
            meta = item["metadata"]
            if path.endswith("namespaces") and (item.get("status") or {}).get("phase") == "Terminating":
                continue
            out.append(f"{path.rsplit('/', 1)[1]}/{meta.get('namespace', '')}/{meta['name']}")
    return out


def test_an_upgrade_keeps_the_generated_keys_and_uninstall_leaves_nothing(
    cluster_ready: RemoteNode, helm_cli: Helm, real_kube: RealKube
) -> None:
    ns = "mini"
    real_kube.namespace(ns, enforce="restricted")
    values = str(CHART / "ci" / "minimal-values.yaml")
    helm_cli("install", "mini", str(CHART), "-n", ns, "-f", values)
    secret = real_kube.request("GET", f"/api/v1/namespaces/{ns}/secrets/mini-dynrunner").json()
    generated = secret["data"]
    assert generated, secret
    assert _ours(real_kube, "mini"), "the install made nothing labelled as the release's"
    helm_cli("upgrade", "mini", str(CHART), "-n", ns, "-f", values, "--set", "controller.replicas=3")
    again = real_kube.request("GET", f"/api/v1/namespaces/{ns}/secrets/mini-dynrunner").json()["data"]
    assert again == generated
    helm_cli("uninstall", "mini", "-n", ns, "--wait", "--timeout", "120s")
    deadline = time.monotonic() + 60
    while (left := _ours(real_kube, "mini")) and time.monotonic() < deadline:
        time.sleep(1)
    assert left == [], left


async def test_a_pod_pool_values_file_gives_each_pool_namespace_the_declared_rights(
    cluster_ready: RemoteNode, helm_cli: Helm, real_kube: RealKube, gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    """ci/two-pools-values.yaml: a second Pod pool in a namespace of its own (made by the admin,
    `restricted`), without identity. The chart's token has the declared rights in both pool
    namespaces, and a job of the second pool runs with it there."""
    ns, large = "pools", "ci-large"
    real_kube.namespace(ns, enforce="restricted")
    real_kube.namespace(large, enforce="restricted")
    helm_cli("install", "pools", str(CHART), "-n", ns, "-f", str(CHART / "ci" / "two-pools-values.yaml"))
    token = _token(real_kube, ns, "pools-dynrunner-controller")
    for namespace in (f"{ns}-jobs", large):
        granted = _granted(real_kube, token, namespace)
        wanted = _declared(namespace, *({f"{ns}-jobs", large} - {namespace}))
        assert granted == wanted, (namespace, sorted(granted ^ wanted))
    kubeconfig = real_kube.kubeconfig(tmp_path / "sa.kubeconfig", token=token, namespace=large)
    data = kube_controller_data(
        gitea.url, gitea.registration_token, nats_url, kubeconfig, tmp_path / "state", namespace=large, identity=False
    )
    async with in_process(ControllerConfig.model_validate(data)) as running:
        run = gitea.submit("acme/big", QUICK)
        done = await wait_run_done(gitea, run.id, within=120)
        assert done.status == "success", "\n".join(gitea.task(done.jobs[0].task_id).log_rows)
        await wait_for(
            lambda: not any(p.capacity.in_use for p in running.controller.pools.values()), within=60, what="reaped"
        )
    await wait_for(lambda: _none_left(real_kube, large), within=60, what="no Pod or Secret left")
    helm_cli("uninstall", "pools", "-n", ns, "--wait", "--timeout", "120s")
