"""Controller throughput and latency: claim → publish → launch against the Gitea double.

Three processes besides this one: the Gitea double (`dynrunner-gitea-double serve`), the
controller (`dynrunner-controller run`, embedded nats-server, `local` backend) and NATS. The
executor is a no-op (`/bin/true`): the figures are the controller's, not a job's.

  backlog  N jobs (default 1000) are queued before the controller starts: claims+launches per
           second, and each job's wait (queued → claimed, dominated by its place in the queue)
  steady   M single-job runs (default 100) submitted one at a time, 50 ms apart, to an idle
           controller: pickup latency (queued → claimed) p50/p99
  both     claimed → environment created p50/p99, and the controller's RSS

CPU per job (backlog, from the controller's "controller running" until the last environment
exists, per process: the controller itself, the wrappers and executors it started and
reaped, the double, NATS) shows what limits the rate on a shared machine;
`controller_alone_jobs_per_s_per_cpu` is the rate one CPU would sustain for the controller
alone. The bench polls the double sparingly (it shares the CPUs): the newest run only until
it is claimed, then the tasks not launched yet, every 0.5 s.

Times come from the job logs: the controller's stage lines "claimed by pool …" (written right
after the claim) and "environment … created" (right before the executor starts) carry
timestamps; "queued" is when the double's admin API returned the new run. Figures are
printed, never asserted.

    .venv/bin/python -m tests.bench.bench_controller
    .venv/bin/python -m pytest -q -s tests/bench/bench_controller.py
Environment: DYNRUNNER_BENCH_N, DYNRUNNER_BENCH_STEADY, DYNRUNNER_BENCH_PBKDF2 (the double's
token hash iterations; default 1 so the controller, not the double's PBKDF2, is measured;
Gitea uses 10000), DYNRUNNER_BENCH_FETCH ("interval,max" seconds; default the config's),
TMPDIR (where the double's and the controller's state, and so every job's directory, go:
directory and file creation costs differ a lot between file systems, see docs/operations.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.bench import env_int, nats_pid, rss_kib
from tests.fixtures.double_process import admin, cpu_s, pct, stamp, stop_all

BIN = Path(sys.executable).parent
POLL_S = 0.5


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
        with (self.workdir / "double.log").open("wb") as out:
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

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the controller logs that every loop runs (its start-up CPU is not the jobs')."""
        deadline = time.monotonic() + timeout
        log = self.workdir / "controller.log"
        while b"controller running" not in log.read_bytes():
            if time.monotonic() > deadline:
                raise TimeoutError("the controller did not start")
            time.sleep(0.01)

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
        with (self.workdir / "controller.log").open("wb") as out:  # the child keeps its own descriptor
            self.controller = subprocess.Popen(
                [str(BIN / "dynrunner-controller"), "run", "--config", str(path)], stdout=out, stderr=subprocess.STDOUT
            )
        self.procs.append(self.controller)

    def stop(self) -> None:
        stop_all(self.procs)

    def jobs(self, run_ids: list[int]) -> list[dict[str, Any]]:
        return [job for rid in run_ids for job in admin(self.base, "GET", f"/runs/{rid}/jobs")]

    def wait_launched(
        self, run_ids: list[int], expected: int, timeout: float = 600
    ) -> tuple[list[dict[str, Any]], dict[int, tuple[float, float]]]:
        """The jobs, and the (claimed, environment created) log times of each one's task, once
        all are launched.

        Polls cheaply (the double shares the CPUs with the controller): only the newest run
        until its jobs are claimed (Gitea picks the oldest waiting job first), then only
        the tasks not launched yet."""
        deadline = time.monotonic() + timeout
        while not all(job["task_id"] for job in admin(self.base, "GET", f"/runs/{run_ids[-1]}/jobs")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the newest run's jobs are not all claimed after {timeout}s")
            time.sleep(POLL_S)
        jobs = self.jobs(run_ids)
        waiting = {job["task_id"]: job for job in jobs}
        if len(waiting) != expected or not all(waiting):
            raise AssertionError(f"{len(waiting)} tasks for {expected} jobs")
        times: dict[int, tuple[float, float]] = {}
        while True:
            for task_id in list(waiting):
                task = admin(self.base, "GET", f"/tasks/{task_id}")
                if len(task["log_times"]) >= 2:
                    times[task_id] = (stamp(task["log_times"][0]), stamp(task["log_times"][1]))
                    del waiting[task_id]
            if not waiting:
                return jobs, times
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(waiting)} of {expected} jobs not launched after {timeout}s")
            time.sleep(POLL_S)


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
            assert bench.controller is not None
            pids = {"controller": bench.controller.pid, "gitea_double": bench.procs[0].pid}
            bench.wait_ready()
            pids["nats"] = nats_pid(bench.controller.pid)  # type: ignore[assignment]
            cpu_ready = {name: cpu_s(pid) for name, pid in pids.items()}
            _, backlog_times = bench.wait_launched(run_ids, n)
            backlog = list(backlog_times.values())
            rss_backlog = rss_kib(bench.controller.pid)
            time.sleep(1.5)  # the reaper collects the last executors (their CPU counts once reaped)
            cpu_done = {name: cpu_s(pid) for name, pid in pids.items()}
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
            jobs, times = bench.wait_launched(steady_ids, steady)
            pickup = [times[job["task_id"]][0] - steady_queued[job["run_id"]] for job in jobs]
            steady_launch = [e - c for c, e in times.values()]
            rss_end = rss_kib(bench.controller.pid)
        finally:
            bench.stop()
    cpu_ms = {name: 1000 * (cpu_done[name][0] - cpu_ready[name][0]) / n for name in pids}
    cpu_ms["controller_children"] = 1000 * (cpu_done["controller"][1] - cpu_ready["controller"][1]) / n
    wall = last_launch - first_claim
    return {
        "n": n,
        "controller_start_to_first_claim_s": first_claim - t0,
        "backlog_jobs_per_s": n / wall,
        "backlog_wall_s": wall,
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
        **{f"cpu_ms_per_job_{k}": v for k, v in cpu_ms.items()},
        "cpu_ms_per_job_total": sum(cpu_ms.values()),
        "controller_alone_jobs_per_s_per_cpu": 1000 / (cpu_ms["controller"] + cpu_ms["controller_children"]),
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
