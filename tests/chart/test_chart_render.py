"""The chart lints, renders for every values file CI keeps (charts/dynrunner/ci/), and every
object it renders validates offline: built-in kinds against the Kubernetes OpenAPI schemas of the
oldest version the chart supports and the newest kubernetes-validate knows (strict: an unknown
field fails), the Prometheus Operator's kinds against their CRDs' schemas (tests/chart/schemas).
Its values schema rejects typos and out-of-range values at every level, and its generated parts
are those the code generates today."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tests.fixtures.chart import CHART, VALUES_FILES, Chart, RenderError, find

SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): json.loads((SCHEMAS / "servicemonitor.schema.json").read_text()),
    ("monitoring.coreos.com/v1", "PrometheusRule"): json.loads((SCHEMAS / "prometheusrule.schema.json").read_text()),
}
OLDEST = "1.27.0"  # Chart.yaml's kubeVersion


@functools.cache
def rendered(chart: Chart, values: str) -> list[dict[str, Any]]:
    return chart.render([values])


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_generate", CHART.parent / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ci_keeps_the_values_files_the_issue_names() -> None:
    assert {"ci/minimal-values.yaml", "ci/production-values.yaml", "ci/external-nats-values.yaml"} <= set(VALUES_FILES)
    assert "ci/two-pools-values.yaml" in VALUES_FILES


@pytest.mark.parametrize("values", VALUES_FILES)
def test_helm_lint_passes(chart: Chart, values: str) -> None:
    done = chart.run("lint", "--strict", str(CHART), "--values", str(CHART / values))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("values", VALUES_FILES)
def test_every_rendered_object_validates_offline(chart: Chart, values: str) -> None:
    objects = rendered(chart, values)
    assert objects
    for obj in objects:
        crd = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
        if crd is not None:
            jsonschema.validate(obj, crd)
            continue
        for version in (OLDEST, latest_version()):
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_production_values_render_every_kind_the_chart_has(chart: Chart) -> None:
    kinds = {o["kind"] for o in rendered(chart, "ci/production-values.yaml")}
    assert kinds >= {
        "Deployment", "PodDisruptionBudget", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
        "ClusterRoleBinding", "ConfigMap", "Secret", "Namespace", "NetworkPolicy", "Service", "ServiceMonitor",
        "PrometheusRule", "PersistentVolumeClaim",
    }  # fmt: skip
    bundled = {o["kind"] for o in rendered(chart, "ci/minimal-values.yaml")}
    assert "StatefulSet" in bundled


@pytest.mark.parametrize(
    ("kind", "spec", "typo"),
    [
        ("ServiceMonitor", {"selector": {}, "endpoints": [{"port": "metrics", "intervall": "30s"}]}, "intervall"),
        ("PrometheusRule", {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "1", "fro": "5m"}]}]}, "fro"),
    ],
)
def test_a_crd_schema_refuses_an_unknown_field(kind: str, spec: dict[str, Any], typo: str) -> None:
    """The CRD schemas are closed where the chart renders, so they can catch a typo."""
    obj = {"apiVersion": "monitoring.coreos.com/v1", "kind": kind, "metadata": {"name": "x", "namespace": "ci"}}
    with pytest.raises(jsonschema.ValidationError, match=f"'{typo}' was unexpected"):
        jsonschema.validate({**obj, "spec": spec}, CRD_SCHEMAS[("monitoring.coreos.com/v1", kind)])


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("controller.replica=3", "/controller"),
        ("nats.bundled.storag.size=1Gi", "/nats/bundled"),
        ("config.pools[0].maxConcurency=3", "/config/pools/0"),
        ("config.gitea.fetchInterval=1", "/config/gitea"),
        ("kubernetesDefaults.imagePullPolicyy=Always", "/kubernetesDefaults"),
        ("metrics.serviceMonitor.intervall=1m", "/metrics/serviceMonitor"),
        ("metrics.prometheusRule.alerts.natsUnreachable.fro=1m", "/metrics/prometheusRule/alerts/natsUnreachable"),
        ("executorNetworkPolicy.internet.enable=true", "/executorNetworkPolicy/internet"),
        # Keys the chart owns: a secret never goes into the ConfigMap, the files are the chart's.
        ("config.gitea.registrationToken=0123456789", "/config/gitea"),
        ("config.sealing.keyFile=/k", "/config"),
        ("config.nats.url=nats://elsewhere:4222", "/config/nats"),
        ("config.pools[0].backend.kubeconfig=/k", "/config/pools/0/backend"),
    ],
)
def test_the_values_schema_rejects_unknown_keys(chart: Chart, setting: str, where: str) -> None:
    with pytest.raises(RenderError) as refused:
        chart.render(["ci/minimal-values.yaml"], extra=("--set", setting))
    message = str(refused.value)
    assert where in message and "additional propert" in message, message


POOL = {"name": "pod", "labels": ["self-hosted", "pod"]}


@pytest.mark.parametrize(
    ("overlay", "why"),
    [
        ({"config": {"pools": [{**POOL, "maxConcurrency": 0}]}}, "minimum"),
        ({"config": {"gitea": {"url": "https://g", "credentialMode": "sometimes"}}}, "ephemeral"),
        ({"config": {"nats": {"replicas": 7}}}, "maximum"),
        ({"config": {"pools": [{**POOL, "name": "Has_Caps"}]}}, "does not match pattern"),
        ({"config": {"pools": [{**POOL, "labels": ["self hosted"]}]}}, "does not match pattern"),
        ({"controller": {"antiAffinity": "always"}}, "soft"),
        ({"config": {"pools": [{**POOL, "backend": {"kind": "docker"}}]}}, "kind"),
        ({"config": {"pools": [{**POOL, "backend": {"imagePullPolicy": "Sometimes"}}]}}, "Always"),
        ({"config": {"pools": [{**POOL, "backend": {"kind": "local", "namespace": "ci"}}]}}, "namespace"),
        ({"retiredSealingKeys": [{"existingSecret": "old-key"}]}, "missing property 'key'"),
    ],
)
def test_the_values_schema_rejects_values_the_controller_would_refuse(
    chart: Chart, overlay: dict[str, Any], why: str
) -> None:
    with pytest.raises(RenderError, match=why):
        chart.render(["ci/minimal-values.yaml"], overlay=overlay)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"registrationToken.value": ""}, "registrationToken: set value"),
        ({"registrationToken.existingSecret": "t"}, "registrationToken: set value or existingSecret, not both"),
        ({"config.gitea.url": ""}, "config.gitea.url is required"),
        ({"executorNetworkPolicy.gitea.to": "null"}, "executorNetworkPolicy.gitea.to is required"),
        ({"config.artifacts.driver": "S3", "config.artifacts.bucket": "b"}, "artifactStore.to is required"),
        ({"config.identity.cluster": ""}, "config.identity.cluster is required for pool pod"),
        ({"config.nats.replicas": "3"}, "config.nats.replicas must be 1 with the bundled NATS"),
    ],
)
def test_a_missing_setting_fails_the_render_with_what_to_do(
    chart: Chart, settings: dict[str, str], message: str
) -> None:
    with pytest.raises(RenderError, match=message):
        chart.render(["ci/minimal-values.yaml"], set=settings)


def test_the_generated_parts_are_what_the_code_generates_today() -> None:
    """charts/generate.py (make chart) writes them; a change to the configuration's models or
    to the declared Kubernetes permissions must be carried into the chart."""
    for path, text in generator().expected().items():
        assert path.read_text() == text, f"{path} is stale: run `make chart`"


def test_the_schema_describes_every_key_the_controller_reads_unless_the_chart_sets_it() -> None:
    from dynrunner.controller.config.model import ControllerConfig

    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["$defs"]["ControllerConfig"]["properties"]
    owned = generator().CHART_OWNED["ControllerConfig"]
    assert set(config) | owned == {f.alias or name for name, f in ControllerConfig.model_fields.items()}


def test_a_pool_without_a_backend_is_a_kubernetes_pool_in_the_executor_namespace(chart: Chart) -> None:
    import yaml

    (configmap,) = find(rendered(chart, "ci/two-pools-values.yaml"), "ConfigMap", "-controller")
    pools = {p["name"]: p for p in yaml.safe_load(configmap["data"]["config.yaml"])["pools"]}
    assert pools["pod"]["backend"] == {
        "kind": "kubernetes",
        "namespace": "ci-jobs",
        "image": "dynrunner/executor:0.1.0",
        "workspace": {"emptyDir": {"sizeLimit": "10Gi"}},
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},  # the chart's
    }
    assert pools["large"]["backend"]["namespace"] == "ci-large"
    assert pools["large"]["backend"]["workspace"] == {"emptyDir": {"sizeLimit": "10Gi"}}  # kubernetesDefaults
    assert pools["large"]["backend"]["identity"] is False
