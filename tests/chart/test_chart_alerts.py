"""The chart's alerts read only what the controller exports: every metric an expression names is
one `Metrics` registers (or Prometheus' own `up`), every label value it matches is one the
controller's code writes. promtool checks the rules (PromQL and annotation templates) and runs
each alert against series shaped as the controller exports them: it fires on the failure it is
for, after its `for`, and stays quiet on the healthy case next to it."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from dynrunner.controller.infra.metrics import Metrics
from tests.fixtures.chart import Chart, one

CONTROLLER_SOURCES = Path(__file__).resolve().parents[2] / "controller" / "src" / "dynrunner" / "controller"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}
SCOPE = {"namespace": "ci", "job": "rel-dynrunner-metrics"}
ALERTS = {
    "DynrunnerClaimsFailing",
    "DynrunnerJobsWaiting",
    "DynrunnerJobsSlowToStart",
    "DynrunnerEnvironmentsFailing",
    "DynrunnerControllerDown",
    "DynrunnerNatsUnreachable",
}


@functools.cache
def rules(chart: Chart) -> list[dict[str, Any]]:
    rule = one(chart.render(["ci/production-values.yaml"]), "PrometheusRule")
    (group,) = rule["spec"]["groups"]
    return list(group["rules"])


def exported() -> set[str]:
    """Every sample name the controller's registry can expose."""
    families: list[Metric] = list(Metrics().registry.collect())
    return {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}


def test_the_chart_has_the_alerts_the_issue_asks_for(chart: Chart) -> None:
    assert {r["alert"] for r in rules(chart)} == ALERTS


def test_every_metric_an_alert_reads_is_one_the_controller_exports(chart: Chart) -> None:
    names = exported()
    assert "dynrunner_nats_connected" in names and "dynrunner_fetch_calls_total" in names
    for rule in rules(chart):
        used = set(re.findall(r"\b([a-z_]+)\s*\{", rule["expr"])) - {"by", "on", "unless", "and", "or"}
        assert used, rule["alert"]
        for metric in used:
            assert metric in names or metric == "up", f"{rule['alert']} reads {metric}: metrics.py does not export it"


def test_every_label_value_an_alert_matches_is_one_the_code_writes(chart: Chart) -> None:
    source = "\n".join(p.read_text() for p in CONTROLLER_SOURCES.rglob("*.py"))
    for rule in rules(chart):
        for label, values in re.findall(r'\b(\w+)=~?"([^"]+)"', rule["expr"]):
            if label in SCOPE:
                assert values == SCOPE[label]
                continue
            for value in values.split("|"):
                assert f'"{value}"' in source, f"{rule['alert']}: no code writes {label}={value!r}"


def test_promtool_accepts_the_rules(chart: Chart, promtool: Path, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dynrunner", "rules": rules(chart)}]}))
    done = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    shown = ", ".join(f'{k}="{v}"' for k, v in {**SCOPE, **labels}.items())
    return {"series": f"{metric}{{{shown}}}", "values": values}


POD = {"pod": "rel-dynrunner-controller-a"}
PODPOOL = {**POD, "pool": "pod"}


def fired(alert: str, at: str, severity: str, **labels: str) -> dict[str, Any]:
    return {
        "eval_time": at,
        "alertname": alert,
        "exp_alerts": [{"exp_labels": {"severity": severity, **labels}}],
    }


def quiet(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def histogram(metric: str, slow_from: str, count: str, pool: str = "pod") -> list[dict[str, str]]:
    """Buckets of a histogram whose observations all fall in (300, 600] seconds: `slow_from`
    is the series for the buckets above 300 and `count` for those up to 300."""
    return [
        series(f"{metric}_bucket", count if float(le) <= 300 else slow_from, le=le, pool=pool, **POD)
        for le in ("60", "300", "600", "+Inf")
    ]


SCENARIOS: list[dict[str, Any]] = [
    {
        # Replica a: free slots, Gitea answered for 10 minutes, then nothing. Replica b: answers.
        # Replica c: no answer, but every slot is busy (no poll is expected).
        "interval": "1m",
        "input_series": [
            series("dynrunner_capacity", "20x40", **PODPOOL),
            series("dynrunner_capacity_in_use", "3x40", **PODPOOL),
            series("dynrunner_fetch_calls_total", "0+60x10 600x30", outcome="empty", **PODPOOL),
            series("dynrunner_capacity", "20x40", pod="b", pool="pod"),
            series("dynrunner_capacity_in_use", "3x40", pod="b", pool="pod"),
            series("dynrunner_fetch_calls_total", "0+60x40", outcome="empty", pod="b", pool="pod"),
            series("dynrunner_capacity", "20x40", pod="c", pool="pod"),
            series("dynrunner_capacity_in_use", "20x40", pod="c", pool="pod"),
            series("dynrunner_fetch_calls_total", "0x40", outcome="empty", pod="c", pool="pod"),
        ],
        "alert_rule_test": [
            quiet("DynrunnerClaimsFailing", "12m"),
            fired("DynrunnerClaimsFailing", "30m", "critical", namespace="ci", **PODPOOL),
        ],
    },
    {
        # A replica that never reached Gitea has no answer series at all: it fires too.
        "interval": "1m",
        "input_series": [
            series("dynrunner_capacity", "4x30", **PODPOOL),
            series("dynrunner_capacity_in_use", "0x30", **PODPOOL),
            series("dynrunner_fetch_calls_total", "0+1x30", outcome="error", **PODPOOL),
        ],
        "alert_rule_test": [fired("DynrunnerClaimsFailing", "20m", "critical", namespace="ci", **PODPOOL)],
    },
    {
        # Pool "pod" is full on both replicas for 20 minutes; pool "big" has room on one.
        "interval": "1m",
        "input_series": [
            series("dynrunner_capacity", "20x30", pod="a", pool="pod"),
            series("dynrunner_capacity_in_use", "20x30", pod="a", pool="pod"),
            series("dynrunner_capacity", "20x30", pod="b", pool="pod"),
            series("dynrunner_capacity_in_use", "10+1x10 20x20", pod="b", pool="pod"),
            series("dynrunner_capacity", "5x30", pod="a", pool="big"),
            series("dynrunner_capacity_in_use", "5x30", pod="a", pool="big"),
            series("dynrunner_capacity", "5x30", pod="b", pool="big"),
            series("dynrunner_capacity_in_use", "4x30", pod="b", pool="big"),
        ],
        "alert_rule_test": [
            quiet("DynrunnerJobsWaiting", "20m"),
            fired("DynrunnerJobsWaiting", "27m", "warning", namespace="ci", pool="pod"),
        ],
    },
    {
        # Pool "pod": every job takes 5-10 minutes from claim to a running executor; pool
        # "fast" starts its jobs within a minute.
        "interval": "1m",
        "input_series": [
            *histogram("dynrunner_launched_to_executor_ready_seconds", "0+2x40", "0x40"),
            *histogram("dynrunner_launched_to_executor_ready_seconds", "0+2x40", "0+2x40", pool="fast"),
        ],
        "alert_rule_test": [
            quiet("DynrunnerJobsSlowToStart", "10m"),
            fired("DynrunnerJobsSlowToStart", "35m", "warning", namespace="ci", pool="pod"),
        ],
    },
    {
        # One Pod that could not start; jobs whose own steps failed do not count.
        "interval": "1m",
        "input_series": [
            series("dynrunner_finalized_failed_total", "0x5 1x20", reason="start-failed", **PODPOOL),
            series("dynrunner_finalized_failed_total", "0+1x25", reason="executor-failed", **PODPOOL),
        ],
        "alert_rule_test": [
            quiet("DynrunnerEnvironmentsFailing", "4m"),
            fired("DynrunnerEnvironmentsFailing", "7m", "warning", namespace="ci", pool="pod", reason="start-failed"),
            quiet("DynrunnerEnvironmentsFailing", "24m"),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            series("dynrunner_nats_connected", "1x5 0x10 1x5", **POD),
            series("dynrunner_nats_connected", "1x20", pod="b"),
            series("up", "1x5 0x10", **POD),
            series("up", "1x20", pod="b"),
        ],
        "alert_rule_test": [
            quiet("DynrunnerNatsUnreachable", "6m"),
            fired("DynrunnerNatsUnreachable", "9m", "critical", namespace="ci", **POD),
            quiet("DynrunnerNatsUnreachable", "18m"),
            quiet("DynrunnerControllerDown", "8m"),
            fired("DynrunnerControllerDown", "12m", "critical", **SCOPE, **POD),
        ],
    },
]


def test_each_alert_fires_on_its_failure_and_not_on_the_healthy_case(
    chart: Chart, promtool: Path, tmp_path: Path
) -> None:
    bare = [{k: v for k, v in r.items() if k != "annotations"} for r in rules(chart)]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dynrunner", "rules": bare}]}))
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": SCENARIOS}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    tested = {t["alertname"] for s in SCENARIOS for t in s["alert_rule_test"] if t["exp_alerts"]}
    assert tested == ALERTS
    done = subprocess.run(
        [str(promtool), "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("disabled", ["claimsFailing", "natsUnreachable"])
def test_an_alert_can_be_turned_off(chart: Chart, disabled: str) -> None:
    objects = chart.render(
        ["ci/production-values.yaml"], set={f"metrics.prometheusRule.alerts.{disabled}.enabled": "false"}
    )
    names = {r["alert"] for r in one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]}
    assert len(names) == len(ALERTS) - 1
