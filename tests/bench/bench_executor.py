"""The executor's own costs, end to end through a real reporting path. Figures are printed, never asserted.

The Gitea double runs as its own process (`dynrunner-gitea-double serve`, Gitea's PBKDF2
cost for every authenticated call); each executor run is the `dynrunner-executor run`
console script on an assignment claimed from it, exactly as a launcher starts it.
  * per-step overhead: a job of N `run: "true"` steps minus a job of 1 such step, divided
    by N-1, for our executor and for `act` in host mode on the same workflow (ratio);
  * executor start to first step: spawn of the executor process to the first step's
    shell reading the clock ($EPOCHREALTIME), and spawn to exit for a one-step job;
  * log throughput: one step printing LINES lines of ~70 bytes; lines/s over the whole
    executor run (wall clock, with the double on the same machine) and per executor
    CPU-second; every row is read back from the double (no loss);
  * peak RSS of the executor process (its VmHWM, sampled until it exits) for both kinds of job;
  * composite actions: a job whose steps are 10 local composite actions (each one `run: "true"`
    step; the actions are copied into the workspace by a first step, as a checkout would) minus
    the job with the copy step alone, per action, for our executor and for `act` (ratio); the
    fastest of the repetitions (the least disturbed by other work on a shared machine), and our
    executor's CPU time.

    .venv/bin/python -m tests.bench.bench_executor
    .venv/bin/python -m pytest -q -s tests/bench/bench_executor.py
DYNRUNNER_BENCH_LINES sets the log line count (default 200000); DYNRUNNER_BENCH_STEPS the
step count (default 40); DYNRUNNER_BENCH_REPEAT the repetitions (default 3, median reported);
DYNRUNNER_BENCH_DIR where workspaces, act's HOME and the double's state go (both runners use
the same file system, which matters: small-file creation costs differ a lot between them).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fixtures.bench import BIN, Double, admin, run_executor, steps_workflow

LINES = int(os.environ.get("DYNRUNNER_BENCH_LINES", "200000"))
STEPS = int(os.environ.get("DYNRUNNER_BENCH_STEPS", "40"))
REPEAT = int(os.environ.get("DYNRUNNER_BENCH_REPEAT", "3"))
LINE = "the quick brown fox compiled src/main.c with -O2: warning unused variable 1234"


def clock_workflow(stamp: Path) -> str:
    steps = f'      - run: echo "$EPOCHREALTIME" > {stamp}\n'
    return f"on: push\njobs:\n  bench:\n    runs-on: self-hosted\n    steps:\n{steps}"


COMPOSITE_ACTIONS = 10


def composite_workflow(source: Path, actions: int) -> str:
    steps = f'      - run: cp -R "{source}/." .\n'
    steps += "".join(f"      - uses: ./.github/actions/a{i}\n" for i in range(actions))
    return f"on: push\njobs:\n  bench:\n    runs-on: self-hosted\n    steps:\n{steps}"


def write_composite_actions(source: Path) -> None:
    for i in range(COMPOSITE_ACTIONS):
        action = source / ".github" / "actions" / f"a{i}"
        action.mkdir(parents=True)
        (action / "action.yml").write_text(
            f'name: a{i}\nruns:\n  using: composite\n  steps:\n    - shell: bash\n      run: "true"\n'
        )


LOG_WORKFLOW = f"""on: push
jobs:
  bench:
    runs-on: self-hosted
    steps:
      - run: |
          yes '{LINE}' | head -n {LINES}
"""


def run_act(workflow: str, directory: Path) -> float:
    repo, home = directory / "repo", directory / "home"
    (repo / ".github" / "workflows").mkdir(parents=True)
    home.mkdir()
    (repo / ".github" / "workflows" / "ci.yml").write_text(workflow)
    env = {**os.environ, "HOME": str(home)}
    git = ["git", "-c", "user.email=b@example.org", "-c", "user.name=b"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "bench"]):
        subprocess.run([*git, *args], cwd=repo, check=True, env=env)
    t0 = time.perf_counter()
    subprocess.run(
        [str(BIN / "act"), "push", "-P", "self-hosted=-self-hosted"],
        cwd=repo,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


async def per_step(tmp: Path, double: Double, what: str, act_step: float | None) -> None:
    counter = iter(range(10_000))

    async def executor_run(workflow: str) -> dict[str, float]:
        _, path = await double.claim(workflow, tmp / f"steps-{what}-{next(counter)}")
        return await asyncio.to_thread(run_executor, path)

    ours_1 = [await executor_run(steps_workflow(1)) for _ in range(REPEAT)]
    ours_n = [await executor_run(steps_workflow(STEPS)) for _ in range(REPEAT)]
    t1, tn = (statistics.median(r["wall_s"] for r in runs) for runs in (ours_1, ours_n))
    c1, cn = (statistics.median(r["cpu_s"] for r in runs) for runs in (ours_1, ours_n))
    ours_step = (tn - t1) / (STEPS - 1)
    line = (
        f"per-step overhead, {what}: ours {ours_step * 1000:.1f} ms wall "
        f"({STEPS} steps {tn:.2f}s, 1 step {t1:.2f}s), executor CPU {(cn - c1) / (STEPS - 1) * 1000:.1f} ms per step"
    )
    if act_step is not None:
        line += f"; ratio ours/act {ours_step / act_step:.2f}"
    print(line)
    print(
        f"  one-step job: spawn to exit {t1 * 1000:.0f} ms, CPU {c1 * 1000:.0f} ms, "
        f"peak RSS {max(r['rss_mib'] for r in ours_1):.1f} MiB; "
        f"{STEPS}-step job peak RSS {max(r['rss_mib'] for r in ours_n):.1f} MiB"
    )


async def composite(tmp: Path, double: Double) -> None:
    """Per composite action: the job with 10 of them minus the job with the copy step alone."""
    tmp = Path(tempfile.mkdtemp(prefix="composite-", dir=tmp))
    source = tmp / "composite-src"
    write_composite_actions(source)
    with_actions, without = composite_workflow(source, COMPOSITE_ACTIONS), composite_workflow(source, 0)
    counter = iter(range(10_000))

    async def ours(workflow: str) -> dict[str, float]:
        _, path = await double.claim(workflow, tmp / f"composite-{next(counter)}")
        return await asyncio.to_thread(run_executor, path)

    runs0 = [await ours(without) for _ in range(REPEAT)]
    runs10 = [await ours(with_actions) for _ in range(REPEAT)]
    t0, t10 = (min(r["wall_s"] for r in runs) for runs in (runs0, runs10))
    c0, c10 = (statistics.median(r["cpu_s"] for r in runs) for runs in (runs0, runs10))
    per_action = (t10 - t0) / COMPOSITE_ACTIONS
    line = (
        f"composite actions: ours {per_action * 1000:.1f} ms per action, executor CPU "
        f"{(c10 - c0) / COMPOSITE_ACTIONS * 1000:.1f} ms ({COMPOSITE_ACTIONS} actions {t10:.2f}s, copy step "
        f"alone {t0:.2f}s)"
    )
    if (BIN / "act").exists():
        a0 = min(run_act(without, tmp / f"act-composite-{next(counter)}") for _ in range(REPEAT))
        a10 = min(run_act(with_actions, tmp / f"act-composite-{next(counter)}") for _ in range(REPEAT))
        act_action = (a10 - a0) / COMPOSITE_ACTIONS
        line += f"; act {act_action * 1000:.1f} ms per action ({a10:.2f}s, {a0:.2f}s); ratio ours/act "
        line += f"{per_action / act_action:.2f}"
    print(line)


async def measure(tmp: Path) -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    act_step = None
    if (BIN / "act").exists():
        act_1 = statistics.median(run_act(steps_workflow(1), tmp / f"act1-{i}") for i in range(REPEAT))
        act_n = statistics.median(run_act(steps_workflow(STEPS), tmp / f"actn-{i}") for i in range(REPEAT))
        act_step = (act_n - act_1) / (STEPS - 1)
        print(
            f"per-step overhead, act host mode: {act_step * 1000:.1f} ms "
            f"({STEPS} steps {act_n:.2f}s, 1 step {act_1:.2f}s)"
        )
    else:
        print("act not installed: no ratio")
    cheap = Double(tmp / "double-cheap", "--pbkdf2-iterations", "1")
    try:
        await per_step(tmp, cheap, "double with cheap token checks (the executor's own cost)", act_step)
        await composite(tmp, cheap)
    finally:
        cheap.close()

    double = Double(tmp / "double")
    counter = iter(range(10_000))

    async def executor_run(workflow: str) -> tuple[int, dict[str, float]]:
        task_id, path = await double.claim(workflow, tmp / f"job-{next(counter)}")
        return task_id, await asyncio.to_thread(run_executor, path)

    try:
        await per_step(tmp, double, "double with Gitea's PBKDF2 cost (same machine)", act_step)

        delays = []
        for i in range(REPEAT):
            stamp = tmp / f"stamp-{i}"
            _, r = await executor_run(clock_workflow(stamp))
            delays.append(float(stamp.read_text()) - r["spawned_at"])
        print(
            f"executor start to first step: median {statistics.median(delays) * 1000:.0f} ms "
            f"(min {min(delays) * 1000:.0f}, max {max(delays) * 1000:.0f}; includes interpreter start, "
            "imports, the log-position handshake and step 1 start)"
        )

        task_id, r = await executor_run(LOG_WORKFLOW)
        task = admin(double.url, f"/_double/tasks/{task_id}")
        step = task["steps"][0]
        rows = task["log_rows"][step["log_index"] : step["log_index"] + step["log_length"]]
        printed = rows[rows.index("##[endgroup]") + 1 :]
        loss = "no loss" if printed == [LINE] * LINES else f"MISMATCH: {len(printed)} rows"
        print(
            f"log throughput: {LINES:,} lines in {r['wall_s']:.2f}s = {LINES / r['wall_s']:,.0f} lines/s wall "
            f"(whole executor run, reported to the double and read back: {loss}); "
            f"executor CPU {r['cpu_s']:.2f}s = {LINES / r['cpu_s']:,.0f} lines per CPU-second; "
            f"peak RSS {r['rss_mib']:.1f} MiB"
        )
    finally:
        double.close()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-executor-", dir=os.environ.get("DYNRUNNER_BENCH_DIR")))
    try:
        asyncio.run(measure(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_executor_costs() -> None:
    main()


if __name__ == "__main__":
    main()
