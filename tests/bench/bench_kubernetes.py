"""The kubernetes backend under load: N queued jobs (default 500) claimed and launched as Pods,
then as many more, so 2N Pods live at once (default 1,000), until they end and are reaped.

Processes: the Gitea double (`dynrunner-gitea-double serve`), the Kubernetes API, scheduler,
kubelet and SPIRE doubles (`dynrunner-kube-double serve`: apart, so the double and the
controller do not share a GIL), the controller's embedded nats-server, and this process, which
runs the controller (so its Kubernetes client's request counts can be read) and nothing else
while it is measured. Each Pod runs `sleep` for SLEEP seconds instead of an executor: the
figures are the controller's, not a job's.

Printed (never asserted):
  claim → Pod created p50/p99 of the N queued jobs (the claim's stage line in the task's log,
      and the controller's "Pod … created" log record of the same task);
  Kubernetes API requests per job, by request (watches count once per connection), and the
      GETs sent while the Pods ran (none is polling);
  the controller's CPU per job (this process, from "controller running" until every Pod is
      reaped) and its RSS with 2N live Pods.

    .venv/bin/python -m pytest -q -s -o python_files='bench_*.py' tests/bench/bench_kubernetes.py
Environment: DYNRUNNER_BENCH_K8S_N (500), DYNRUNNER_BENCH_K8S_SLEEP (seconds a Pod lives, 45),
DYNRUNNER_BENCH_K8S_NODES (12; 110 Pods each).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from dynrunner.controller.app import Controller
from dynrunner.controller.backends.kubernetes.backend import KubernetesBackend
from dynrunner.controller.config import ControllerConfig
from dynrunner.controller.logs import configure_logging
from tests.bench.bench_controller import admin, pct, rss_kib, stamp

BIN = Path(sys.executable).parent
IMAGE = "registry.example/dynrunner/executor:1.0"


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


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


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def until(check: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.2)


def running(backend: KubernetesBackend) -> int:
    count = 0
    for pod in backend.pods.cache.values():
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        count += any("running" in (s.get("state") or {}) for s in statuses)
    return count


async def measure(workdir: Path, n: int, sleep_s: int, nodes: int) -> dict[str, Any]:
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
        cfg = ControllerConfig.model_validate(
            {
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
                "stateDir": str(workdir / "controller"),
            }
        )
        log_file = (workdir / "controller.log").open("w")
        configure_logging("info", json=True, stream=log_file)
        controller = Controller(cfg)
        stop = asyncio.Event()
        task = asyncio.create_task(controller.run(stop))
        await until(controller.ready.is_set, 60, "controller ready")
        pool = controller.pools["pod"]
        backend = pool.backend
        assert isinstance(backend, KubernetesBackend)
        cpu0, t0 = cpu_s(), time.monotonic()
        await until(lambda: running(backend) >= n, 600, f"{n} Pods running")
        backlog_s = time.monotonic() - t0
        more = submit(base, n)
        await until(lambda: running(backend) >= 2 * n, 600, f"{2 * n} Pods running")
        rss_live = rss_kib(os.getpid())[0] / 1024
        calls_running = Counter(backend.api.calls)
        await asyncio.sleep(5)  # the Pods run: what does the controller ask meanwhile?
        calls_idle = Counter(backend.api.calls) - calls_running
        await until(lambda: pool.capacity.in_use == 0 and not backend.pods.cache, 600, "every Pod reaped")
        cpu = cpu_s() - cpu0
        calls = Counter(backend.api.calls)
        stop.set()
        await task
        log_file.close()
        claimed = {}
        for run_id in queued:
            for job in admin(base, "GET", f"/runs/{run_id}/jobs"):
                task_log = admin(base, "GET", f"/tasks/{job['task_id']}")
                claimed[job["task_id"]] = stamp(task_log["log_times"][0])
        created = {}
        for line in (workdir / "controller.log").read_text().splitlines():
            record = json.loads(line)
            if record["message"].startswith("Pod ci-jobs/") and record["message"].endswith(" created"):
                created[int(record["task_id"])] = _epoch(record["time"])
        latency = [created[t] - claimed[t] for t in claimed if t in created]
        jobs = 2 * n
        assert len(more) and len(latency) == n, (len(latency), n)
        return {
            "jobs": jobs,
            "queued_jobs": n,
            "queued_claim_to_pod_created_p50_s": pct(latency, 0.5),
            "queued_claim_to_pod_created_p99_s": pct(latency, 0.99),
            "queued_all_running_s": backlog_s,
            "api_requests_per_job": sum(calls.values()) / jobs,
            **{f"api_{name}_per_job": count / jobs for name, count in sorted(calls.items())},
            "api_requests_while_running_5s": sum(calls_idle.values()),
            "controller_cpu_ms_per_job": 1000 * cpu / jobs,
            "controller_rss_mib_with_live_pods": rss_live,
            "live_pods": jobs,
        }
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def test_bench_kubernetes_backend() -> None:
    n = env_int("DYNRUNNER_BENCH_K8S_N", 500)
    sleep_s = env_int("DYNRUNNER_BENCH_K8S_SLEEP", 45)
    nodes = env_int("DYNRUNNER_BENCH_K8S_NODES", 12)
    with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
        figures = asyncio.run(measure(Path(tmp), n, sleep_s, nodes))
    print(f"\nkubernetes backend bench: {os.cpu_count()} CPUs, {nodes} nodes, Pods live {sleep_s}s")
    for key, value in figures.items():
        print(f"  {key:44} {value:10.3f}" if isinstance(value, float) else f"  {key:44} {value:10}")
