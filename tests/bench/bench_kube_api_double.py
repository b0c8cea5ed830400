"""Throughput of the Kubernetes API double through the official client, with 1,000 Pods
(figures only, no assertions on time): the backend's own benchmark with 1,000 live Pods
runs against this double, so its cost must be known.

Run: `make bench` or `.venv/bin/python -m pytest -q -s tests/bench/bench_kube_api_double.py`.
Phases: create (1 and 8 client threads), get, list (label selector, 1,000 items), status
patches, and watch fan-out (W watchers each receiving every Pod's MODIFIED event).
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, watch

from dynrunner.doubles.kubernetes import ApiServer
from tests.fixtures.kubernetes import api_client

PODS = 1_000
THREADS = 8
WATCHERS = 10


def pod(i: int) -> dict[str, Any]:
    labels = {"dynrunner.io/pool": "pod", "dynrunner.io/assignment-id": f"a{i}"}
    spec = {
        "restartPolicy": "Never",
        "containers": [{"name": "executor", "image": "registry.example/dynrunner/executor:1.0"}],
    }
    return {"metadata": {"name": f"job-{i}", "labels": labels}, "spec": spec}


def rate(count: int, fn: Callable[[int], Any], threads: int = 1) -> float:
    started = time.perf_counter()
    if threads == 1:
        for i in range(count):
            fn(i)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fn, range(count)))
    return count / (time.perf_counter() - started)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_api_double_with_1000_pods() -> None:
    with ApiServer.running(bookmark_interval=60) as api, api_client(api) as apic:
        api_client_pool = apic.rest_client.pool_manager
        api_client_pool.connection_pool_kw["maxsize"] = THREADS
        v1 = client.CoreV1Api(apic)
        before = rss_mib()
        create_1 = rate(PODS // 2, lambda i: v1.create_namespaced_pod("default", pod(i)))
        create_n = rate(PODS // 2, lambda i: v1.create_namespaced_pod("default", pod(PODS // 2 + i)), THREADS)
        get_n = rate(PODS, lambda i: v1.read_namespaced_pod(f"job-{i}", "default"), THREADS)
        started = time.perf_counter()
        listed = v1.list_namespaced_pod("default", label_selector="dynrunner.io/pool=pod")
        list_s = time.perf_counter() - started
        assert len(listed.items) == PODS
        rv = listed.metadata.resource_version

        received = [0] * WATCHERS
        ready = threading.Barrier(WATCHERS + 1)

        def watcher(w: int) -> None:
            with api_client(api) as own:
                ready.wait()
                for event in watch.Watch().stream(
                    client.CoreV1Api(own).list_namespaced_pod, "default", resource_version=rv, timeout_seconds=60
                ):
                    if event["type"] == "MODIFIED":
                        received[w] += 1
                        if received[w] == PODS:
                            return

        threads = [threading.Thread(target=watcher, args=(w,)) for w in range(WATCHERS)]
        for thread in threads:
            thread.start()
        ready.wait()
        started = time.perf_counter()
        patch_n = rate(
            PODS,
            lambda i: v1.patch_namespaced_pod_status(f"job-{i}", "default", {"status": {"phase": "Running"}}),
            THREADS,
        )
        for thread in threads:
            thread.join(120)
        fanout_s = time.perf_counter() - started
        delivered = sum(received)
        print(
            f"\nKubernetes API double, {PODS} Pods, official client (urllib3), {THREADS} client threads where noted:\n"
            f"  create           {create_1:7.0f}/s (1 thread)   {create_n:7.0f}/s ({THREADS} threads)\n"
            f"  get              {get_n:7.0f}/s ({THREADS} threads)\n"
            f"  list (selector)  {list_s * 1000:7.1f} ms for {PODS} Pods\n"
            f"  status patch     {patch_n:7.0f}/s ({THREADS} threads) while {WATCHERS} watchers stream\n"
            f"  watch fan-out    {delivered} events to {WATCHERS} watchers in {fanout_s:.2f} s "
            f"= {delivered / fanout_s:7.0f} events/s "
            f"({min(received)}..{max(received)} per watcher)\n"
            f"  requests served  {api.requests}; "
            f"test process peak RSS {rss_mib():.0f} MiB (+{rss_mib() - before:.0f} MiB)"
        )


if __name__ == "__main__":
    test_api_double_with_1000_pods()


def test_kubelet_double_with_1000_live_pods(tmp_path) -> None:
    """1,000 Pods really running (`sleep`) on 4 nodes: time until all are Running, and the API's
    rates meanwhile (what the backend's benchmark with 1,000 live Pods stands on)."""
    from dynrunner.doubles.kubernetes.cluster import Cluster, NodeSpec
    from dynrunner.doubles.kubernetes.images import Image

    nodes = [NodeSpec(f"node-{i}", pods=300) for i in range(4)]
    sleeper = {"registry.example/sleep:1": Image(entrypoint=("sleep",), cmd=("600",))}
    with Cluster.running(tmp_path, nodes=nodes, images=sleeper) as cluster, api_client(cluster.api) as apic:
        apic.rest_client.pool_manager.connection_pool_kw["maxsize"] = THREADS
        v1 = client.CoreV1Api(apic)

        def live(i: int) -> dict[str, Any]:
            body = pod(i)
            body["spec"]["containers"][0]["image"] = "registry.example/sleep:1"
            return body

        started = time.perf_counter()
        create = rate(PODS, lambda i: v1.create_namespaced_pod("default", live(i)), THREADS)
        deadline = time.monotonic() + 300
        while (running := len(v1.list_namespaced_pod("default", field_selector="status.phase=Running").items)) < PODS:
            assert time.monotonic() < deadline, f"only {running} Pods running"
            time.sleep(0.5)
        all_running_s = time.perf_counter() - started
        get_n = rate(PODS, lambda i: v1.read_namespaced_pod(f"job-{i}", "default"), THREADS)
        started = time.perf_counter()
        rate(PODS, lambda i: v1.delete_namespaced_pod(f"job-{i}", "default", grace_period_seconds=1), THREADS)
        while v1.list_namespaced_pod("default").items:
            time.sleep(0.5)
        all_gone_s = time.perf_counter() - started
        print(
            f"\nKubelet double, {PODS} live Pods (sleep) on {len(nodes)} nodes:\n"
            f"  create {create:.0f}/s; all Running {all_running_s:.1f} s after the first create\n"
            f"  get {get_n:.0f}/s ({THREADS} threads) with {PODS} processes running\n"
            f"  graceful delete of all (SIGTERM, grace 1 s): gone after {all_gone_s:.1f} s\n"
            f"  events recorded {len(v1.list_namespaced_event('default').items)}; "
            f"test process peak RSS {rss_mib():.0f} MiB"
        )


def test_api_double_as_a_process(tmp_path) -> None:
    """The same calls against `dynrunner-kube-double serve` in its own process: no GIL shared
    with the client, as when a controller under test runs beside it."""
    import json
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from kubernetes import config

    program = Path(sys.executable).parent / "dynrunner-kube-double"
    proc = subprocess.Popen([str(program), "serve", "--state-dir", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        apic = config.new_client_from_config(info["kubeconfig"])
        apic.rest_client.pool_manager.connection_pool_kw["maxsize"] = THREADS
        v1 = client.CoreV1Api(apic)
        create_1 = rate(PODS // 2, lambda i: v1.create_namespaced_pod("default", pod(i)))
        create_n = rate(PODS // 2, lambda i: v1.create_namespaced_pod("default", pod(PODS // 2 + i)), THREADS)
        get_n = rate(PODS, lambda i: v1.read_namespaced_pod(f"job-{i}", "default"), THREADS)
        patch_n = rate(
            PODS,
            lambda i: v1.patch_namespaced_pod_status(f"job-{i}", "default", {"status": {"phase": "Running"}}),
            THREADS,
        )
        apic.close()
        print(
            f"\nKubernetes API double as a process, {PODS} Pods (one node: 110 bound and failing to pull an unknown "
            "image, the rest unschedulable):\n"
            f"  create {create_1:.0f}/s (1 thread), {create_n:.0f}/s ({THREADS} threads); get {get_n:.0f}/s; "
            f"status patch {patch_n:.0f}/s ({THREADS} threads)"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
