"""`make soak-suite`: the integration and end-to-end tiers, three rounds, beside a CPU hog.

A test that passes on a quiet machine and fails under load has an unbounded wait, a race or a
clock in it; this finds those before CI does. The hog keeps the load average at or above
`--load` (default 4 on these 2-core machines) with busy processes at normal priority; every
failure of every round is reported, and the exit status is 1 if there was any.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAILED = re.compile(r"^(FAILED|ERROR) (\S+)", re.MULTILINE)


def _spin() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=4, help="busy processes beside the suite")
    parser.add_argument("paths", nargs="*", default=["tests/integration", "tests/e2e"])
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for hog in hogs:
        hog.start()
    failures: dict[int, list[str]] = {}
    try:
        for n in range(1, args.rounds + 1):
            started = time.monotonic()
            run = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.paths],
                check=False,
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            log = ROOT / ".soak-suite" / f"round-{n}.log"
            log.parent.mkdir(exist_ok=True)
            log.write_text(run.stdout + run.stderr)
            failures[n] = [f"{kind} {test}" for kind, test in FAILED.findall(run.stdout)]
            if run.returncode not in (0, 1) and not failures[n]:
                failures[n] = [f"pytest exited {run.returncode} (see {log})"]
            summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
            load = os.getloadavg()[0]
            print(f"soak-suite round {n}: {summary} in {time.monotonic() - started:.0f} s, load {load:.1f} ({log})")
            for failure in failures[n]:
                print(f"  {failure}")
    finally:
        for hog in hogs:
            hog.terminate()
    total = sum(len(f) for f in failures.values())
    print(f"soak-suite: {total} failure(s) in {args.rounds} round(s) with {args.load} busy processes beside")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
