"""What idle polling costs Gitea, by the 1.26 cost model, and what it buys (pickup latency).

Two processes besides this one: the Gitea double (`dynrunner-gitea-double serve --profile
1.26`, PBKDF2 at Gitea's 10,000 iterations) and the controller (`dynrunner-controller run`,
embedded NATS, `local` backend, executor `/bin/true`, default fetch intervals), run once per
pool count.

  idle    P pools (default 1 and 10) with nothing to do for W seconds (default 30): the
          FetchTasks each pool sends per second, and what each costs the double (its
          `/_double/costs`): PBKDF2 token checks, runner-row writes, job scans, the CPU its
          worker threads spent answering (PBKDF2 + SQLite, what Gitea does too; Go's PBKDF2 costs
          about what OpenSSL's does) and the whole process's CPU (with Python's HTTP stack,
          which Go's is far cheaper than). From these: Gitea CPU per idle pool and per 100 pools.
  pickup  J jobs (default 20) submitted to the idle controller (1 pool) 1-4 s apart, at random:
          queued (the admin API's answer) → claimed (the time on the job's "claimed by pool"
          stage line), p50/p99/max.
  main    the idle phase once more against `--profile main` (heartbeat writes debounced to one
          every 30 s per runner) for comparison.

Figures are printed, never asserted.

    .venv/bin/python -m tests.bench.bench_polling_cost
    .venv/bin/python -m pytest -q -s tests/bench/bench_polling_cost.py
Environment: DYNRUNNER_BENCH_POOLS ("1,10"), DYNRUNNER_BENCH_IDLE_S (30), DYNRUNNER_BENCH_JOBS (20).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tests.fixtures.double_process import admin, cpu_s, pct, stamp, stop_all

BIN = Path(sys.executable).parent


def pbkdf2_ms() -> float:
    started = time.process_time()
    for _ in range(50):
        hashlib.pbkdf2_hmac("sha256", b"0" * 40, b"salt567890", 10_000, dklen=50)
    return (time.process_time() - started) * 1000 / 50


class Setup:
    def __init__(self, workdir: Path, profile: str, pools: int) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        double = subprocess.Popen(
            [str(BIN / "dynrunner-gitea-double"), "serve", "--state-dir", str(workdir / "gitea"), "--profile", profile],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(double)
        assert double.stdout is not None
        info = json.loads(double.stdout.readline())
        self.base, self.double_pid = info["url"], double.pid
        config = {
            "gitea": {"url": self.base, "registrationToken": info["registration_token"]},
            "pools": [
                {
                    "name": f"p{i}",
                    "labels": ["self-hosted", f"p{i}"],
                    "backend": {"kind": "local", "executorCommand": ["/bin/true"]},
                }
                for i in range(pools)
            ],
            "metrics": {"address": ""},
            "stateDir": str(workdir / "controller"),
        }
        (workdir / "controller.yaml").write_text(yaml.safe_dump(config))
        log = workdir / "controller.log"
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [str(BIN / "dynrunner-controller"), "run", "--config", str(workdir / "controller.yaml")],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 60
        while b"controller running" not in log.read_bytes():
            assert time.monotonic() < deadline, "the controller did not start"
            time.sleep(0.05)
        time.sleep(5)  # the loops register their runners and settle into idle polling

    def stop(self) -> None:
        stop_all(self.procs)


def idle(setup: Setup, pools: int, seconds: float) -> dict[str, float]:
    before, cpu_before, t0 = admin(setup.base, "GET", "/costs"), cpu_s(setup.double_pid)[0], time.monotonic()
    time.sleep(seconds)
    after, cpu_after, wall = admin(setup.base, "GET", "/costs"), cpu_s(setup.double_pid)[0], time.monotonic() - t0
    fetches = after["calls"].get("FetchTask", 0) - before["calls"].get("FetchTask", 0)
    calls = sum(after["calls"].values()) - sum(before["calls"].values())
    engine_s = after["cpu_s"].get("FetchTask", 0.0) - before["cpu_s"].get("FetchTask", 0.0)
    per_fetch_ms = 1000 * engine_s / max(1, fetches)
    per_call_process_ms = 1000 * (cpu_after - cpu_before) / max(1, calls)
    rate = fetches / wall / pools
    return {
        "fetch_per_s_per_pool": rate,
        "pbkdf2_per_fetch": (after["pbkdf2"] - before["pbkdf2"]) / max(1, fetches),
        "runner_writes_per_fetch": (after["runner_writes"] - before["runner_writes"]) / max(1, fetches),
        "scans_per_fetch": (after["scans"] - before["scans"]) / max(1, fetches),
        "engine_cpu_ms_per_fetch": per_fetch_ms,
        "process_cpu_ms_per_call": per_call_process_ms,
        "gitea_cpu_ms_per_s_per_idle_pool": rate * per_fetch_ms,
        "gitea_cpu_ms_per_s_per_100_pools": 100 * rate * per_fetch_ms,
        "double_process_cpu_ms_per_s_per_pool": 1000 * (cpu_after - cpu_before) / wall / pools,
    }


def pickup(setup: Setup, jobs: int) -> list[float]:
    rng = random.Random(10)
    workflow = "on: push\njobs:\n  job:\n    runs-on: [self-hosted, p0]\n    steps:\n      - run: 'true'\n"
    queued: dict[int, float] = {}
    for _ in range(jobs):
        time.sleep(rng.uniform(1.0, 4.0))
        run = admin(setup.base, "POST", "/runs", {"repository": "bench/pickup", "workflow": workflow})
        queued[run["id"]] = time.time()
    latencies = []
    deadline = time.monotonic() + 120
    for run_id, at in queued.items():
        while True:
            [job] = admin(setup.base, "GET", f"/runs/{run_id}/jobs")
            task = admin(setup.base, "GET", f"/tasks/{job['task_id']}") if job["task_id"] else None
            rows = [] if task is None else list(zip(task["log_rows"], task["log_times"], strict=True))
            claimed = [stamp(t) for row, t in rows if "claimed by pool" in row]
            if claimed:
                latencies.append(claimed[0] - at)
                break
            assert time.monotonic() < deadline, f"run {run_id} not claimed"
            time.sleep(0.2)
    return latencies


def run(pool_counts: list[int], seconds: float, jobs: int) -> None:
    print(f"\npolling cost bench: {os.cpu_count()} CPUs, idle {seconds:.0f} s per setting, PBKDF2 10,000 iterations")
    print(f"  one PBKDF2 token check here (OpenSSL via hashlib): {pbkdf2_ms():.2f} ms of CPU")
    for profile, counts in (("1.26", pool_counts), ("main", pool_counts[:1])):
        for pools in counts:
            with tempfile.TemporaryDirectory(prefix="bench-polling-") as tmp:
                setup = Setup(Path(tmp), profile, pools)
                try:
                    figures = idle(setup, pools, seconds)
                    latencies = pickup(setup, jobs) if profile == "1.26" and pools == 1 else []
                finally:
                    setup.stop()
            print(f"  Gitea {profile}, {pools} idle pool(s):")
            for key, value in figures.items():
                print(f"    {key:40} {value:10.3f}")
            if latencies:
                print(
                    f"    pickup of {len(latencies)} jobs at an idle pool: p50 {pct(latencies, 0.5):.2f} s, "
                    f"p99 {pct(latencies, 0.99):.2f} s, max {max(latencies):.2f} s"
                )


def main() -> None:
    pools = [int(p) for p in os.environ.get("DYNRUNNER_BENCH_POOLS", "1,10").split(",")]
    run(pools, float(os.environ.get("DYNRUNNER_BENCH_IDLE_S") or 30), int(os.environ.get("DYNRUNNER_BENCH_JOBS") or 20))


def test_bench_polling_cost() -> None:
    main()


if __name__ == "__main__":
    main()
