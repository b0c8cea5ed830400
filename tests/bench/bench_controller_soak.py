"""What the controller's process keeps as days of jobs go by: the soak of
tests/fixtures/controller_soak.py (the whole job path on virtual time, mixed traffic), with
tracemalloc snapshots at the first and the last idle checkpoint (a day apart or more), and
the allocation sites that grew most in between. Figures are printed, never asserted (the
soak test asserts the controller's structures return to their idle sizes).

    .venv/bin/python -m tests.bench.bench_controller_soak
    .venv/bin/python -m pytest -q -s tests/bench/bench_controller_soak.py
Environment: DYNRUNNER_BENCH_HOURS (default 72).
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

from tests.fixtures.controller_soak import ControllerSoak
from tests.fixtures.virtual_time import virtual_time

HOURS = float(os.environ.get("DYNRUNNER_BENCH_HOURS", "72"))
TOP = 12
CONTROLLER = "/dynrunner/controller/"


def soak_memory(tmp: Path, hours: float = HOURS) -> None:
    soak = ControllerSoak(tmp, hours=hours)
    snapshots: list[tuple[float, tracemalloc.Snapshot]] = []

    def snapshot() -> dict[str, int]:
        sizes = soak.sizes()
        if not any(sizes[k] for k in ("world.environments", "log.messages", "capacity.in_use")):
            gc.collect()
            snapshots.append((soak.checkpoints[-1].at_h if soak.checkpoints else 0.0, tracemalloc.take_snapshot()))
        return {}

    tracemalloc.start(1)
    started = time.perf_counter()
    try:
        checkpoint = soak.checkpoint

        async def measured() -> None:
            await checkpoint()
            snapshot()

        soak.checkpoint = measured  # type: ignore[method-assign]
        with virtual_time() as runner:
            runner.run(soak.run())
    finally:
        tracemalloc.stop()
        soak.close()
    wall = time.perf_counter() - started
    (first_h, first), (last_h, last) = snapshots[0], snapshots[-1]
    total = sum(s.size_diff for s in last.compare_to(first, "filename"))
    print(
        f"\n{hours:.0f} h (virtual), {len(soak.expected)} jobs, {wall:.1f} s with tracemalloc; "
        f"idle at {first_h:.0f} h and {last_h:.0f} h: traced memory {total / 1024:+.1f} KiB "
        f"({total / max(1, len(soak.expected)):+.0f} B per job over the whole run)"
    )
    print("top growth by line (controller's own code marked *):")
    for stat in last.compare_to(first, "lineno")[:TOP]:
        frame = stat.traceback[0]
        mark = "*" if CONTROLLER in frame.filename else " "
        where = "/".join(Path(frame.filename).parts[-3:])
        print(f"  {mark} {stat.size_diff / 1024:+8.1f} KiB {stat.count_diff:+6d} blocks  {where}:{frame.lineno}")
    ours = [s for s in last.compare_to(first, "filename") if CONTROLLER in s.traceback[0].filename]
    print(f"controller's own files: {sum(s.size_diff for s in ours) / 1024:+.1f} KiB")


def test_bench_controller_soak_memory(tmp_path: Path) -> None:
    soak_memory(tmp_path)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        soak_memory(Path(tmp))
