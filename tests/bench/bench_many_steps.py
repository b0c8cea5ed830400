"""A job of many steps, end to end: what its step reports cost the executor and Gitea. Figures are printed.

The Gitea double runs as its own process (`dynrunner-gitea-double serve`, Gitea's PBKDF2
cost for every authenticated call) behind the fault proxy (`tests/fixtures/faults.py`),
which counts every request and its body; each executor run is the `dynrunner-executor run`
console script on an assignment claimed from the double, reporting through the proxy. For
a job of STEPS `run: "true"` steps, and one of a tenth of them (the ratio shows how the
cost per step grows with the job):
  * wall time and CPU of the executor process, and its peak RSS (VmHWM);
  * UpdateTask and UpdateLog requests: how many, their body bytes in all, the largest body;
  * the task as Gitea stored it: its result, and every step's status and log range.

    .venv/bin/python -m tests.bench.bench_many_steps
    .venv/bin/python -m pytest -q -s tests/bench/bench_many_steps.py
DYNRUNNER_BENCH_STEPS sets the step count (default 20000); DYNRUNNER_BENCH_DIR where the
workspaces and the double's state go.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

from dynrunner.proto.assignment import encode
from tests.fixtures.bench import Double, admin, run_executor, steps_workflow
from tests.fixtures.executor import claim_task, new_assignment
from tests.fixtures.faults import FaultProxy, fault_proxy

STEPS = int(os.environ.get("DYNRUNNER_BENCH_STEPS", "20000"))
UPDATE_TASK = "/api/actions/runner.v1.RunnerService/UpdateTask"
UPDATE_LOG = "/api/actions/runner.v1.RunnerService/UpdateLog"


async def run_job(double: Double, proxy: FaultProxy, steps: int, workspace: Path) -> dict[str, float]:
    admin(double.url, "/_double/runs", {"repository": "bench/app", "workflow": steps_workflow(steps)})
    task, runner = await claim_task(double.url, double.token, name="bench")
    workspace.mkdir(parents=True)  # noqa: ASYNC240 - a benchmark's setup
    assignment = new_assignment(task, runner, proxy.url, workspace, pool="bench", job_key="bench")
    path = workspace.with_suffix(".pb")
    path.write_bytes(encode(assignment))
    proxy.forwarded.clear()
    result = await asyncio.to_thread(run_executor, path)
    stored = admin(double.url, f"/_double/tasks/{task.id}")
    statuses = {step["status"] for step in stored["steps"]}
    ranges = all(
        step["log_length"] > 0 and step["log_index"] + step["log_length"] == after["log_index"]
        for step, after in zip(stored["steps"], stored["steps"][1:], strict=False)
    )
    for path_name, key in ((UPDATE_TASK, "task"), (UPDATE_LOG, "log")):
        bodies = [size for name, size in proxy.forwarded if name == path_name]
        result[f"{key}_requests"] = len(bodies)
        result[f"{key}_bytes"] = sum(bodies)
        result[f"{key}_largest"] = max(bodies, default=0)
    print(
        f"{steps} steps: {result['wall_s']:.1f} s wall ({result['wall_s'] / steps * 1000:.2f} ms a step), "
        f"executor CPU {result['cpu_s']:.1f} s, peak RSS {result['rss_mib']:.0f} MiB; "
        f"task {stored['status']}, steps {'/'.join(sorted(statuses))}, log ranges {'right' if ranges else 'WRONG'}"
    )
    print(
        f"  UpdateTask: {result['task_requests']:.0f} requests, {result['task_bytes'] / 2**20:.1f} MiB "
        f"(largest {result['task_largest'] / 1024:.0f} KiB); "
        f"UpdateLog: {result['log_requests']:.0f} requests, {result['log_bytes'] / 2**20:.2f} MiB "
        f"(largest {result['log_largest'] / 1024:.0f} KiB)"
    )
    return result


async def measure(tmp: Path) -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    double = Double(tmp / "double")
    try:
        async with fault_proxy(double.url) as proxy:
            small = await run_job(double, proxy, STEPS // 10, tmp / "small")
            large = await run_job(double, proxy, STEPS, tmp / "large")
        print(
            f"per step, {STEPS} steps against {STEPS // 10}: wall x{large['wall_s'] / small['wall_s'] / 10:.2f}, "
            f"executor CPU x{large['cpu_s'] / small['cpu_s'] / 10:.2f}, "
            f"UpdateTask bytes x{large['task_bytes'] / small['task_bytes'] / 10:.1f}"
        )
    finally:
        double.close()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-steps-", dir=os.environ.get("DYNRUNNER_BENCH_DIR")))
    try:
        asyncio.run(measure(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_many_steps() -> None:
    main()


if __name__ == "__main__":
    main()
