"""What containing and isolating a local job costs: one job's create → executor ended →
deleted, for each containment this machine offers and with `runAsUser`.

The executor is a no-op (`/bin/true`), the backend is driven directly (no controller, no
Gitea), jobs run one after another: the figures are the backend's own per-job cost, printed
with the ratio to `process-scan` (no containment). Needs root for pid-namespace and
runAsUser; what is not available here is skipped and said. Figures are printed, never
asserted.

    .venv/bin/python -m tests.bench.bench_local_backend
    .venv/bin/python -m pytest -q -s tests/bench/bench_local_backend.py
Environment: DYNRUNNER_BENCH_JOBS (default 40 per mode).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dynrunner.controller.backends.base import Phase
from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.controller.backends.local.containment import Kind, choose
from dynrunner.controller.backends.local.isolation import IsolationError, resolve_user, sandbox
from tests.fixtures.local_backend import assignment, launch

NOBODY = "65534"


async def one_mode(base: Path, mode: str, jobs: int) -> list[tuple[float, float]] | str:
    kind, _, isolated = mode.partition("+")
    root = base / mode.replace("+", "-") / "root"
    root.mkdir(parents=True)
    try:
        containment = choose(kind, root, "bench")
        box = None
        if isolated:
            box = sandbox(
                resolve_user(NOBODY, None),
                controller_paths={base / "state"},
                config_file=None,
                root_dir=root,
                executor="/bin/true",
                store="",
            )
    except (ValueError, IsolationError) as err:
        return str(err)
    b = LocalBackend("bench", root, ["/bin/true"], base_env={"PATH": os.defpath}, containment=containment, sandbox=box)
    times = []
    for i in range(jobs):
        start = time.perf_counter()
        env = await launch(b, assignment(f"00000000-0000-4000-8000-{i:012d}"))
        for _ in itertools.count():
            if (await b.observe(env)).phase is Phase.SUCCEEDED:
                break
            await asyncio.sleep(0.002)
        ended = time.perf_counter()
        await b.delete(env)
        times.append((ended - start, time.perf_counter() - ended))
    await b.aclose()
    return times


def workdir() -> Path:
    """Outside /tmp (isolated jobs get a private one), traversable by the jobs' user."""
    base = Path(tempfile.mkdtemp(prefix="dynrunner-bench-", dir="/run" if os.geteuid() == 0 else None))
    base.chmod(0o755)
    return base


def cell(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:6.1f} ({sorted(values)[int(len(values) * 0.9) - 1] * 1000:5.1f})"


async def main() -> None:
    jobs = int(os.environ.get("DYNRUNNER_BENCH_JOBS") or 40)
    base = workdir()
    try:
        results = {}
        for mode in [*(k.value for k in reversed(Kind)), "cgroup-v2+runAsUser", "pid-namespace+runAsUser"]:
            results[mode] = await one_mode(base, mode, jobs)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    reference = results.get("process-scan")
    ref = statistics.median(a + b for a, b in reference) if isinstance(reference, list) else None
    print(f"\nlocal backend, {jobs} jobs per mode, one at a time, executor /bin/true; medians (p90) in ms")
    print(f"  {'mode':26s} {'create→ended':>16s} {'delete':>14s} {'total':>14s}")
    for mode, found in results.items():
        if isinstance(found, str):
            print(f"  {mode:26s} not available here: {found}")
            continue
        columns = [[a for a, _ in found], [b for _, b in found], [a + b for a, b in found]]
        cells = [
            f"{statistics.median(c) * 1000:6.1f} ({sorted(c)[int(len(c) * 0.9) - 1] * 1000:5.1f})" for c in columns
        ]
        ratio = f"  ×{statistics.median(columns[2]) / ref:.2f} of process-scan" if ref else ""
        print(f"  {mode:26s} {cells[0]:>16s} {cells[1]:>14s} {cells[2]:>14s}{ratio}")


def test_bench_local_backend() -> None:
    asyncio.run(main())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    asyncio.run(main())
