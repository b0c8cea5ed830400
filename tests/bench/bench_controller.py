"""Controller throughput and latency: claim → publish → launch against the Gitea double.

Three processes besides this one: the Gitea double (`dynrunner-gitea-double serve`), the
controller (`dynrunner-controller run`, embedded nats-server, `local` backend) and NATS. The
executor is a no-op (`/bin/true`): the figures are the controller's, not a job's.

  backlog  N jobs (default 1000) are queued before the controller starts: claims+launches per
           second, and each job's wait (queued → claimed, dominated by its place in the queue)
  steady   M single-job runs (default 100) submitted one at a time, 50 ms apart, to an idle
           controller: pickup latency (queued → claimed) p50/p99
  both     claimed → environment created p50/p99, and the controller's RSS

Times come from the job logs: the controller's stage lines "claimed by pool …" (written right
after the claim) and "environment … created" (right before the executor starts) carry
timestamps; "queued" is when the double's admin API returned the new run. Figures are
printed, never asserted.

    .venv/bin/python tests/bench/bench_controller.py
    .venv/bin/python -m pytest -q -s tests/bench/bench_controller.py
Environment: DYNRUNNER_BENCH_N, DYNRUNNER_BENCH_STEADY, DYNRUNNER_BENCH_PBKDF2 (the double's
token hash iterations; default 1 so the controller, not the double's PBKDF2, is measured;
Gitea uses 10000), DYNRUNNER_BENCH_FETCH ("interval,max" seconds; default the config's).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

BIN = Path(sys.executable).parent


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def admin(base: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}/_double{path}", data=data, method=method)
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def stamp(text: str) -> float:
    """Gitea's log row time (RFC 3339, 7 fractional digits) as epoch seconds."""
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def rss_kib(pid: int) -> tuple[int, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def cpu_s(pid: int) -> float:
    """User+system CPU seconds of `pid` (and of the children it waited for)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / ticks


def nats_pid(controller: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == controller and b"nats-server" in cmd:
                return int(entry.name)
    return None


def matrix_workflow(n: int) -> str:
    return yaml.safe_dump(
        {
            "on": "push",
            "jobs": {
                "job": {
                    "runs-on": ["self-hosted", "local"],
                    "strategy": {"matrix": {"i": list(range(n))}},
                    "steps": [{"run": "true"}],
                }
            },
        }
    )


SINGLE = "on: push\njobs:\n  job:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: 'true'\n"


class Bench:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.base = ""
        self.token = ""
        self.controller: subprocess.Popen[bytes] | None = None

    def start_double(self, iterations: int) -> None:
        out = (self.workdir / "double.log").open("wb")
        proc = subprocess.Popen(
            [
                str(BIN / "dynrunner-gitea-double"),
                "serve",
                "--state-dir",
                str(self.workdir / "gitea"),
                "--port",
                "0",
                "--pbkdf2-iterations",
                str(iterations),
            ],
            stdout=subprocess.PIPE,
            stderr=out,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        self.base, self.token = info["url"], info["registration_token"]

    def start_controller(self, fetch: tuple[float, float] | None) -> None:
        gitea: dict[str, Any] = {"url": self.base, "registrationToken": self.token}
        if fetch is not None:
            gitea.update(fetchIntervalSeconds=fetch[0], fetchIntervalMaxSeconds=fetch[1])
        config = {
            "gitea": gitea,
            "pools": [
                {
                    "name": "local",
                    "labels": ["self-hosted", "local"],
                    "maxConcurrency": 5000,
                    "backend": {"kind": "local", "executorCommand": ["/bin/true"]},
                }
            ],
            "metrics": {"address": ""},
            "stateDir": str(self.workdir / "controller"),
        }
        path = self.workdir / "controller.yaml"
        path.write_text(yaml.safe_dump(config))
        out = (self.workdir / "controller.log").open("wb")
        self.controller = subprocess.Popen(
            [str(BIN / "dynrunner-controller"), "run", "--config", str(path)], stdout=out, stderr=subprocess.STDOUT
        )
        self.procs.append(self.controller)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def jobs(self, run_ids: list[int]) -> list[dict[str, Any]]:
        return [job for rid in run_ids for job in admin(self.base, "GET", f"/runs/{rid}/jobs")]

    def wait_launched(self, run_ids: list[int], expected: int, timeout: float = 600) -> list[tuple[float, float]]:
        """(claimed, environment created) log times of every job, once all are launched."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.jobs(run_ids)
            claimed = [j for j in jobs if j["task_id"]]
            if len(claimed) == expected:
                times = []
                for job in claimed:
                    task = admin(self.base, "GET", f"/tasks/{job['task_id']}")
                    if len(task["log_times"]) < 2:
                        break
                    times.append((stamp(task["log_times"][0]), stamp(task["log_times"][1])))
                else:
                    return times
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(claimed)}/{expected} jobs claimed after {timeout}s")
            time.sleep(0.2)


def run(n: int, steady: int, iterations: int, fetch: tuple[float, float] | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-controller-") as tmp:
        bench = Bench(Path(tmp))
        try:
            bench.start_double(iterations)
            run_ids, queued = [], []
            per_run = 100
            for start in range(0, n, per_run):
                size = min(per_run, n - start)
                run_ids.append(
                    admin(
                        bench.base, "POST", "/runs", {"repository": "bench/backlog", "workflow": matrix_workflow(size)}
                    )["id"]
                )
                queued.append(time.time())
            t0 = time.time()
            bench.start_controller(fetch)
            backlog = bench.wait_launched(run_ids, n)
            assert bench.controller is not None
            rss_backlog = rss_kib(bench.controller.pid)
            nats = nats_pid(bench.controller.pid)
            cpu_backlog = {
                "controller": cpu_s(bench.controller.pid),
                "gitea_double": cpu_s(bench.procs[0].pid),
                "nats": cpu_s(nats) if nats else 0.0,
            }
            first_claim = min(c for c, _ in backlog)
            last_launch = max(e for _, e in backlog)
            backlog_launch = [e - c for c, e in backlog]
            backlog_wait = [c - queued[-1] for c, _ in backlog]

            steady_ids, steady_queued = [], {}
            time.sleep(3)  # let the claimer go idle (its backoff grows)
            for _ in range(steady):
                created = admin(bench.base, "POST", "/runs", {"repository": "bench/steady", "workflow": SINGLE})
                steady_queued[created["id"]] = time.time()
                steady_ids.append(created["id"])
                time.sleep(0.05)
            times = bench.wait_launched(steady_ids, steady)
            jobs = bench.jobs(steady_ids)
            pickup = []
            for job in jobs:
                task = admin(bench.base, "GET", f"/tasks/{job['task_id']}")
                pickup.append(stamp(task["log_times"][0]) - steady_queued[job["run_id"]])
            steady_launch = [e - c for c, e in times]
            rss_end = rss_kib(bench.controller.pid)
        finally:
            bench.stop()
    return {
        "n": n,
        "controller_start_to_first_claim_s": first_claim - t0,
        "backlog_jobs_per_s": n / (last_launch - first_claim),
        "backlog_wall_s": last_launch - first_claim,
        "backlog_wait_p50_s": pct(backlog_wait, 0.5),
        "backlog_wait_p99_s": pct(backlog_wait, 0.99),
        "backlog_claimed_to_created_p50_s": pct(backlog_launch, 0.5),
        "backlog_claimed_to_created_p99_s": pct(backlog_launch, 0.99),
        "steady_jobs": steady,
        "steady_pickup_p50_s": pct(pickup, 0.5),
        "steady_pickup_p99_s": pct(pickup, 0.99),
        "steady_pickup_mean_s": statistics.fmean(pickup),
        "steady_claimed_to_created_p50_s": pct(steady_launch, 0.5),
        "steady_claimed_to_created_p99_s": pct(steady_launch, 0.99),
        **{f"cpu_s_until_backlog_done_{k}": v for k, v in cpu_backlog.items()},
        "rss_after_backlog_mib": rss_backlog[0] / 1024,
        "rss_peak_mib": rss_end[1] / 1024,
        "rss_end_mib": rss_end[0] / 1024,
    }


def report(figures: dict[str, Any], iterations: int, fetch: tuple[float, float] | None) -> None:
    fetching = fetch or "config default"
    print(
        f"\ncontroller bench: {os.cpu_count()} CPUs, double PBKDF2 iterations {iterations}, fetch interval {fetching}"
    )
    for key, value in figures.items():
        print(f"  {key:38} {value:10.3f}" if isinstance(value, float) else f"  {key:38} {value:10}")


def main() -> None:
    n = env_int("DYNRUNNER_BENCH_N", 1000)
    steady = env_int("DYNRUNNER_BENCH_STEADY", 100)
    iterations = env_int("DYNRUNNER_BENCH_PBKDF2", 1)
    fetch_env = os.environ.get("DYNRUNNER_BENCH_FETCH")
    fetch = tuple(float(x) for x in fetch_env.split(",")) if fetch_env else None
    figures = run(n, steady, iterations, fetch)  # type: ignore[arg-type]
    report(figures, iterations, fetch)  # type: ignore[arg-type]


def test_bench_controller() -> None:
    main()


if __name__ == "__main__":
    main()
