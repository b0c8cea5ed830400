"""Metrics: one registry per Metrics object, DESIGN §6 names in the exposition, documented."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from dynrunner.controller.infra.metrics import Metrics


def families(m: Metrics) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(m.exposition().decode())}


def test_exposition_carries_observations_with_labels() -> None:
    m = Metrics()
    m.claim_latency.labels(pool="pod").observe(0.2)
    m.queue_to_claimed.labels(pool="pod").observe(0.4)
    m.claimed_to_launched.labels(pool="pod").observe(1.5)
    m.launched_to_executor_ready.labels(pool="pod").observe(3)
    m.identity_wait.labels(pool="pod").observe(0.7)
    m.job_duration.labels(pool="pod").observe(95)
    m.results.labels(pool="pod", result="success").inc()
    m.finalized_failed.labels(pool="pod", reason="publish").inc()
    m.capacity.labels(pool="pod").set(8)
    m.capacity_in_use.labels(pool="pod").set(3)
    m.errors.labels(pool="pod", kind="gitea").inc(2)
    m.fetch_calls.labels(pool="pod", outcome="empty").inc()
    m.tasks_version_fast_path.labels(pool="pod").inc()
    m.publish_retries.labels(pool="pod").inc()
    m.redeliveries.labels(pool="pod").inc()

    assert m.sample("dynrunner_claim_latency_seconds_count", pool="pod") == 1
    assert m.sample("dynrunner_claimed_to_launched_seconds_sum", pool="pod") == 1.5
    assert m.sample("dynrunner_job_duration_seconds_bucket", pool="pod", le="120.0") == 1
    assert m.sample("dynrunner_job_results_total", pool="pod", result="success") == 1
    assert m.sample("dynrunner_finalized_failed_total", pool="pod", reason="publish") == 1
    assert m.sample("dynrunner_capacity", pool="pod") == 8
    assert m.sample("dynrunner_capacity_in_use", pool="pod") == 3
    assert m.sample("dynrunner_errors_total", pool="pod", kind="gitea") == 2
    assert m.sample("dynrunner_fetch_calls_total", pool="pod", outcome="empty") == 1
    assert m.sample("dynrunner_tasks_version_fast_path_total", pool="pod") == 1

    text = m.exposition().decode()
    assert 'dynrunner_queue_to_claimed_seconds_bucket{le="0.5",pool="pod"} 1.0' in text
    assert 'dynrunner_capacity_in_use{pool="pod"} 3.0' in text


def test_each_metrics_object_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()
    a.results.labels(pool="p", result="failure").inc()
    assert a.sample("dynrunner_job_results_total", pool="p", result="failure") == 1
    assert b.sample("dynrunner_job_results_total", pool="p", result="failure") is None


def test_every_metric_is_documented() -> None:
    doc = (Path(__file__).parents[4] / "docs" / "configuration.md").read_text()
    found = families(Metrics())
    assert len(found) >= 19
    for name, kind in found.items():
        shown = f"{name}_total" if kind == "counter" else name
        assert f"`{shown}`" in doc, shown
