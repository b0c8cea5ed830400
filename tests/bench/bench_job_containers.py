"""Per-job overhead of a job container and of one service (podman, local pool): claim to the
first step, against a plain job. Figures are printed, never asserted.

Each job is claimed from the Gitea double (its own process, cheap token checks) and run by the
`dynrunner-executor run` console script, as a launcher starts it; the first step writes the
clock (`date +%s.%N`, the same clock inside a container) and the figure is that minus the
moment just before the executor was spawned, right after the claim. podman runs through a
wrapper that counts its invocations. Images: the image tier's debootstrap base (bash) and a
redis image built from it (tests/fixtures/job_images.py); without them, or without podman and
Go, it says so and measures nothing.

    .venv/bin/python -m tests.bench.bench_job_containers
    .venv/bin/python -m pytest -q -s tests/bench/bench_job_containers.py
DYNRUNNER_BENCH_REPEAT sets the repetitions (default 5; median, min and max reported).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from tests.fixtures.agent import agent_binary
from tests.fixtures.bench import Double, run_executor
from tests.fixtures.images import BASE_TAG, ENGINE_FLAGS, ULIMITS, Engine
from tests.fixtures.job_images import REDIS, build

REPEAT = int(os.environ.get("DYNRUNNER_BENCH_REPEAT", "5"))
REDIS_TAG = "localhost/dynrunner-bench/redis:latest"


def workflow(stamp: Path, *, container: str = "", service: str = "") -> str:
    text = "on: push\njobs:\n  bench:\n    runs-on: self-hosted\n"
    if container:
        text += f"    container: {container}\n"
    if service:
        text += (
            f"    services:\n      redis:\n        image: {service}\n"
            '        options: --health-cmd "redis-cli ping" --health-interval 1s --health-retries 30\n'
        )
    return text + f"    steps:\n      - run: date +%s.%N > {stamp}\n"


def counting_podman(tmp: Path, podman: str) -> tuple[str, Path]:
    """A podman that logs each call's first argument, for the per-job count."""
    log = tmp / "podman-calls"
    wrapper = tmp / "podman"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {podman} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), log


async def measure(tmp: Path, redis: str, calls: Path) -> None:
    double = Double(tmp / "double", "--pbkdf2-iterations", "1")
    counter = iter(range(10_000))
    variants = {
        "plain job": {},
        "job container": {"container": BASE_TAG},
        "job container + redis service": {"container": BASE_TAG, "service": redis},
        "redis service, steps on the host": {"service": redis},
    }
    try:
        figures: dict[str, dict[str, list[float]]] = {name: {"delay": [], "wall": [], "calls": []} for name in variants}
        for _ in range(REPEAT):  # round robin: a load spike on this shared machine hits every variant alike
            for name, options in variants.items():
                n = next(counter)
                stamp = tmp / f"job-{n}" / "first-step"  # inside the job's root: mounted in its container
                calls.write_text("")  # noqa: ASYNC240 - a benchmark's bookkeeping
                _, path = await double.claim(workflow(stamp, **options), tmp / f"job-{n}")
                r = await asyncio.to_thread(run_executor, path)
                figures[name]["delay"].append(float(stamp.read_text()) - r["spawned_at"])
                figures[name]["wall"].append(r["wall_s"])
                figures[name]["calls"].append(len(calls.read_text().splitlines()))  # noqa: ASYNC240
        for name, f in figures.items():
            delays = f["delay"]
            print(
                f"{name}: claim to first step median {statistics.median(delays) * 1000:.0f} ms "
                f"(min {min(delays) * 1000:.0f}, max {max(delays) * 1000:.0f}); whole job "
                f"{statistics.median(f['wall']):.2f} s; podman calls per job {statistics.median(f['calls']):.0f}"
            )
        plain = figures["plain job"]["delay"]
        for name, f in figures.items():
            if name != "plain job":
                by_median = statistics.median(f["delay"]) - statistics.median(plain)
                print(
                    f"overhead of {name} over a plain job: median {by_median * 1000:.0f} ms, "
                    f"min-to-min {(min(f['delay']) - min(plain)) * 1000:.0f} ms"
                )
    finally:
        double.close()


def main() -> None:
    podman = shutil.which("podman")
    if podman is None or os.geteuid() != 0:
        print("job containers: podman (rootful) is not available here: nothing measured")
        return
    engine = Engine(argv=(podman, *ENGINE_FLAGS))
    if subprocess.run(engine.command("image", "exists", BASE_TAG), check=False).returncode != 0:
        print(f"job containers: {BASE_TAG} is missing (run the image tier once): nothing measured")
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-containers-", dir=os.environ.get("DYNRUNNER_BENCH_DIR")))
    try:
        redis = build(engine, REDIS.format(base=BASE_TAG), REDIS_TAG)
        wrapper, calls = counting_podman(tmp, podman)
        os.environ.update(
            {
                "DYNRUNNER_PODMAN": " ".join((wrapper, *ENGINE_FLAGS)),
                "DYNRUNNER_PODMAN_RUN_OPTIONS": " ".join(ULIMITS),
                "DYNRUNNER_AGENT": str(agent_binary()),
            }
        )
        asyncio.run(measure(tmp, redis, calls))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(engine.command("rmi", "--force", REDIS_TAG), capture_output=True, check=False)


def test_job_container_overhead() -> None:
    main()


if __name__ == "__main__":
    main()
