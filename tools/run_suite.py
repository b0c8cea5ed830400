"""`make test`'s pytest step: the real-peers tier beside the rest of the suite, not after it.

The peers tier (tests/peers) spends most of its time waiting on real Gitea and SPIRE
processes — zombie and endless timeouts, restarts, reapers' cron ticks — while using little
CPU; run after the rest it would add its whole wall time to the suite's. Running it as a second
pytest process overlaps those waits with the CPU-bound tiers. Its output is kept in
`.peers-tier.log` and printed whole when it ends, so the two never interleave; the exit status
is the first non-zero of the two.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = "tests/peers"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial", action="store_true", help="run the peers tier after the rest instead")
    args, pytest_args = parser.parse_known_args(argv)
    pytest = [sys.executable, "-m", "pytest", *pytest_args]
    rest = [*pytest, "tests", f"--ignore={PEERS}"]
    if args.serial:
        status = subprocess.run(rest, cwd=ROOT, check=False).returncode
        return status or subprocess.run([*pytest, PEERS], cwd=ROOT, check=False).returncode
    log = ROOT / ".peers-tier.log"
    started = time.monotonic()
    with log.open("w") as out:
        peers = subprocess.Popen(
            [*pytest, "-p", "no:cacheprovider", PEERS], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            status = subprocess.run(rest, cwd=ROOT, check=False).returncode
            peers_status = peers.wait()
        finally:
            if peers.poll() is None:
                peers.terminate()
                peers.wait()
    print(f"\n===== {PEERS} (run beside the rest; {time.monotonic() - started:.0f} s in all; {log.name}) =====")
    sys.stdout.write(log.read_text())
    return status or peers_status


if __name__ == "__main__":
    sys.exit(main())
