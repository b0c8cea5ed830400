"""Every Prometheus metric of the controller, held by one `Metrics` object (no globals).

The composition root builds one `Metrics` and hands it to the claimers, the assignment log,
launchers and the reaper; the health server exposes `metrics.registry`. Tests build their
own and read values with `sample()`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

# From a fast claim (tens of ms) to a slow image pull or VM boot (minutes).
STAGE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
JOB_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400)
GITEA_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 65)


class Metrics:
    """Names follow DESIGN §6 (`dynrunner_` prefix). Every metric but `nats_connected` has a
    `pool` label; `result`, `kind`, `reason` and `outcome` take values from small closed sets
    chosen by the callers."""

    def __init__(self, namespace: str = "dynrunner") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry

        def seconds(name: str, doc: str, buckets: tuple[float, ...] = STAGE_BUCKETS) -> Histogram:
            return Histogram(name, doc, ["pool"], namespace=namespace, registry=reg, buckets=buckets, unit="seconds")

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, ["pool", *labels], namespace=namespace, registry=reg)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["pool"], namespace=namespace, registry=reg)

        # Latency of each stage of DESIGN §2.
        self.claim_latency = seconds("claim_latency", "FetchTask round trip of calls that returned a task.")
        self.queue_to_claimed = seconds("queue_to_claimed", "From the job becoming waiting in Gitea to its claim.")
        self.claimed_to_launched = seconds("claimed_to_launched", "From claim to the environment being created.")
        self.launched_to_executor_ready = seconds(
            "launched_to_executor_ready", "From environment creation to the executor's first report."
        )
        self.identity_wait = seconds("identity_wait", "Time until the job's workload identity was issued.")
        self.job_duration = seconds("job_duration", "From claim to the task's final state.", JOB_BUCKETS)

        # Outcomes and capacity.
        self.results = counter("job_results", "Finished jobs by result (success, failure, cancelled, ...).", "result")
        self.finalized_failed = counter(
            "finalized_failed", "Tasks the controller finalized as failed, by reason.", "reason"
        )
        self.capacity = gauge("capacity", "Concurrent jobs the pool may run (maxConcurrency).")
        self.capacity_in_use = gauge("capacity_in_use", "Capacity slots held: claiming, launching or running.")
        self.errors = counter("errors", "Errors by kind (gitea, nats, backend, sealing, ...).", "kind")

        # Claim loop.
        self.fetch_calls = counter("fetch_calls", "FetchTask calls by outcome (task, empty, error).", "outcome")
        self.fetch_duration = seconds("fetch_duration", "FetchTask round trip, every call.", GITEA_CALL_BUCKETS)
        self.tasks_version_fast_path = counter(
            "tasks_version_fast_path", "Empty FetchTask answers with tasks_version unchanged (Gitea's cheap path)."
        )
        self.registrations = counter("registrations", "Runner registrations created for claiming.")

        # Assignment log.
        self.published = counter("assignments_published", "Assignments accepted by JetStream.")
        self.publish_retries = counter("publish_retries", "Publish attempts retried after a NATS error or timeout.")
        self.publish_duplicates = counter(
            "publish_duplicates", "Publishes JetStream dropped as duplicates of the same assignment id."
        )
        self.redeliveries = counter("redeliveries", "Assignments delivered to a launcher more than once.")
        self.refused = counter(
            "assignments_refused",
            "Deliveries refused without running anything: unauthenticated, forged, replayed, expired.",
            "reason",
        )
        # Not per pool: the one NATS connection every pool uses (an alert's input; /readyz says why).
        self.nats_connected = Gauge(
            "nats_connected", "1 while connected to NATS, else 0.", namespace=namespace, registry=reg
        )

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def sample(self, name: str, **labels: str) -> float | None:
        """The current value of one sample (e.g. `dynrunner_job_results_total`), None if absent."""
        return self.registry.get_sample_value(name, labels)
