"""The kubernetes backend under load: N queued jobs (default 500) claimed and launched as Pods,
then as many more, so 2N Pods live at once (default 1,000), until they end and are reaped.

Four processes besides this one: the Gitea double (`dynrunner-gitea-double serve`), the
Kubernetes API, scheduler, kubelet and SPIRE doubles (`dynrunner-kube-double serve`), the
controller (`dynrunner-controller run`, a kubernetes pool, JSON logs) and its embedded
nats-server. Each Pod runs `sleep` for SLEEP seconds instead of an executor, so the figures
are the controller's, not a job's. This process only submits runs and reads /proc and logs.

Printed (never asserted):
  claim → Pod created p50/p99 of the N queued jobs (the claim's stage line in the task's log,
      and the controller's "Pod … created" record of the same task);
  Kubernetes API requests per job by request (the controller logs its counts when it stops;
      a watch counts once per connection), and the Pods the double saw polled (none);
  the controller's CPU per job (its own, from "controller running" until every Pod is
      reaped; NATS apart) and its RSS with 2N live Pods.

    .venv/bin/python -m tests.bench.bench_kubernetes
    .venv/bin/python -m pytest -q -s tests/bench/bench_kubernetes.py
Environment: DYNRUNNER_BENCH_K8S_N (500), DYNRUNNER_BENCH_K8S_SLEEP (seconds a Pod lives, 60),
DYNRUNNER_BENCH_K8S_NODES (12; 110 Pods each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.bench import env_int, nats_pid, rss_kib
from tests.fixtures.double_process import admin, cpu_s, pct, stamp, stop_all

BIN = Path(sys.executable).parent
IMAGE = "registry.example/dynrunner/executor:1.0"


def matrix(n: int) -> str:
    job = {"runs-on": ["self-hosted", "pod"], "strategy": {"matrix": {"i": list(range(n))}}, "steps": [{"run": "true"}]}
    return yaml.safe_dump({"on": "push", "jobs": {"job": job}})


def start(argv: list[str], log: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=out)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def submit(base: str, jobs: int) -> list[int]:
    ids = []
    for first in range(0, jobs, 100):
        body = {"repository": "bench/pods", "workflow": matrix(min(100, jobs - first))}
        ids.append(admin(base, "POST", "/runs", body)["id"])
    return ids


def records(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def count(log: Path, predicate: Callable[[dict[str, Any]], bool]) -> int:
    return sum(1 for record in records(log) if predicate(record))


def until(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def created(record: dict[str, Any]) -> bool:
    return record["message"].startswith("Pod ci-jobs/") and record["message"].endswith(" created")


def reaped(record: dict[str, Any]) -> bool:
    return record["message"].startswith("environment dr-") and " reaped " in record["message"]


def measure(workdir: Path, n: int, sleep_s: int, nodes: int) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        gitea, info = start(
            [str(BIN / "dynrunner-gitea-double"), "serve", "--state-dir", str(workdir / "gitea"), "--port", "0",
             "--pbkdf2-iterations", "1"],
            workdir / "gitea.log",
        )  # fmt: skip
        procs.append(gitea)
        base, token = info["url"], info["registration_token"]
        node_args = [arg for i in range(nodes) for arg in ("--node", f"node-{i}")]
        kube, cluster = start(
            [str(BIN / "dynrunner-kube-double"), "serve", "--state-dir", str(workdir / "kube"), "--namespace",
             "ci-jobs", "--image", IMAGE, *node_args],
            workdir / "kube.log",
        )  # fmt: skip
        procs.append(kube)
        queued = submit(base, n)
        config = {
            "gitea": {"url": base, "registrationToken": token},
            "pools": [
                {
                    "name": "pod",
                    "labels": ["self-hosted", "pod"],
                    "maxConcurrency": 2 * n,
                    "backend": {
                        "kind": "kubernetes",
                        "kubeconfig": cluster["kubeconfig"],
                        "namespace": "ci-jobs",
                        "image": IMAGE,
                        "executorCommand": ["/bin/sh", "-c", f"exec sleep {sleep_s}", "executor"],
                    },
                }
            ],
            "identity": {"trustDomain": "example.org", "cluster": "ci"},
            "metrics": {"address": ""},
            "logging": {"level": "info", "json": True},
            "stateDir": str(workdir / "controller"),
        }
        (workdir / "controller.yaml").write_text(yaml.safe_dump(config))
        log = workdir / "controller.log"
        with log.open("wb") as out:
            controller = subprocess.Popen(
                [str(BIN / "dynrunner-controller"), "run", "--config", str(workdir / "controller.yaml")],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(controller)
        until(lambda: b"controller running" in log.read_bytes(), 60, "controller running")
        nats = nats_pid(controller.pid)
        cpu0, nats0, t0 = cpu_s(controller.pid)[0], cpu_s(nats)[0], time.monotonic()
        until(lambda: count(log, created) >= n, 600, f"{n} Pods created")
        queued_s = time.monotonic() - t0
        submit(base, n)
        until(lambda: count(log, created) >= 2 * n, 600, f"{2 * n} Pods created")
        time.sleep(3)  # every Pod scheduled and started: 2N live Pods in the controller's cache
        rss_live = rss_kib(controller.pid)[0] / 1024
        until(lambda: count(log, reaped) >= 2 * n, sleep_s + 600, "every Pod reaped")
        cpu, nats_cpu = cpu_s(controller.pid)[0] - cpu0, cpu_s(nats)[0] - nats0
        controller.terminate()
        controller.wait(60)
        claimed = {}
        for run_id in queued:
            for job in admin(base, "GET", f"/runs/{run_id}/jobs"):
                claimed[job["task_id"]] = stamp(admin(base, "GET", f"/tasks/{job['task_id']}")["log_times"][0])
        made = {int(r["task_id"]): datetime.fromisoformat(r["time"]).timestamp() for r in records(log) if created(r)}
        latency = [made[t] - claimed[t] for t in claimed if t in made]
        [summary] = [r for r in records(log) if "Kubernetes API requests since start" in r["message"]]
        jobs = 2 * n
        return {
            "jobs": jobs,
            "queued_jobs": n,
            "queued_claim_to_pod_created_p50_s": pct(latency, 0.5),
            "queued_claim_to_pod_created_p99_s": pct(latency, 0.99),
            "queued_all_created_s": queued_s,
            "api_requests_per_job": sum(summary["calls"].values()) / jobs,
            **{f"api_{name.replace(' ', '_')}_per_job": c / jobs for name, c in summary["calls"].items()},
            "controller_cpu_ms_per_job": 1000 * cpu / jobs,
            "nats_cpu_ms_per_job": 1000 * nats_cpu / jobs,
            "controller_rss_mib_with_live_pods": rss_live,
            "live_pods": jobs,
        }
    finally:
        stop_all(procs)


def main() -> None:
    n = env_int("DYNRUNNER_BENCH_K8S_N", 500)
    sleep_s = env_int("DYNRUNNER_BENCH_K8S_SLEEP", 60)
    nodes = env_int("DYNRUNNER_BENCH_K8S_NODES", 12)
    with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
        figures = measure(Path(tmp), n, sleep_s, nodes)
    print(f"\nkubernetes backend bench: {os.cpu_count()} CPUs, {nodes} nodes, Pods live {sleep_s}s")
    for key, value in figures.items():
        print(f"  {key:44} {value:10.3f}" if isinstance(value, float) else f"  {key:44} {value:10}")


def test_bench_kubernetes_backend() -> None:
    main()


if __name__ == "__main__":
    main()
