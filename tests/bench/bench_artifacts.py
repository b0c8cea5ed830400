"""Artifact throughput and memory: upload (after a step) and import (staging) of one large file
artifact, and of a directory of many small files, on each driver (Filesystem on a temp dir, S3 on
moto_server over loopback).

Each phase runs in a fresh child process so its peak RSS (VmHWM) is the runtime's own; the
S3 server is a separate process. Figures are printed, never asserted.

    .venv/bin/python tests/bench/bench_artifacts.py           # 64 MiB (quick)
    DYNRUNNER_BENCH_BIG=1 .venv/bin/python tests/bench/bench_artifacts.py   # 1 GiB
    .venv/bin/python -m pytest -q -s tests/bench/bench_artifacts.py          # the same, under pytest

DYNRUNNER_BENCH_SIZE_MB overrides the size; DYNRUNNER_BENCH_DIR chooses where the temp data goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def size_mib() -> int:
    if os.environ.get("DYNRUNNER_BENCH_SIZE_MB"):
        return int(os.environ["DYNRUNNER_BENCH_SIZE_MB"])
    return 1024 if os.environ.get("DYNRUNNER_BENCH_BIG") == "1" else 64


# -- child phases -----------------------------------------------------------------------------------


def child(phase: str, spec: dict[str, str]) -> dict[str, float]:
    from dynrunner.executor.runtime import JobRuntime
    from dynrunner.proto.assignment import ArtifactStoreOptions
    from dynrunner.proto.gitea.types import Need, Result

    options = ArtifactStoreOptions(**json.loads(spec["options"]))
    base_rss = peak_rss_mib()
    started = time.perf_counter()
    if phase == "upload":
        runtime = JobRuntime.create(
            Path(spec["workspace"]), repository="bench/app", run_id="1", job_key="build", artifacts=options, needs={}
        )
        files = runtime.step_files(int(spec["step"]))
        os.rename(spec["source"], files.artifacts_dir / spec["name"])
        started = time.perf_counter()
        asyncio.run(runtime.after_step_success(files, lambda line: None))
        seconds = time.perf_counter() - started
        Path(spec["refs"]).write_text(json.dumps(runtime.job_outputs()))
    else:
        outputs = json.loads(Path(spec["refs"]).read_text())
        runtime = JobRuntime.create(
            Path(spec["workspace"]),
            repository="bench/app",
            run_id="1",
            job_key="deploy",
            artifacts=options,
            needs={"build": Need(outputs=outputs, result=Result.SUCCESS)},
        )
        started = time.perf_counter()
        asyncio.run(runtime.import_artifact(f"jobs.build.artifacts.{spec['name']}", spec["name"], lambda line: None))
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak_rss_mib": peak_rss_mib(), "start_rss_mib": base_rss}


def peak_rss_mib() -> float:
    """This process's high-water RSS (VmHWM: per address space, so a fresh child does not inherit the
    parent's peak the way ru_maxrss does)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(phase: str, spec: dict[str, str], env: dict[str, str]) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--phase", phase, "--spec", json.dumps(spec)],
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{phase} failed:\n{result.stderr}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


# -- orchestration ----------------------------------------------------------------------------------


def write_big_file(path: Path, mib: int) -> int:
    block = os.urandom(MIB)
    with path.open("wb") as fp:
        for i in range(mib):
            fp.write(i.to_bytes(8, "little") + block[8:])
    return mib * MIB


def write_small_files(path: Path, count: int, size: int) -> int:
    path.mkdir()
    for i in range(count):
        sub = path / f"d{i % 20:02d}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i:05d}.txt").write_bytes(os.urandom(size))
    return count * size


class MotoServer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if "Running on http://127.0.0.1:" in line:
                self.endpoint = line.split("Running on ")[1].split()[0]
                break
        else:
            raise RuntimeError("moto_server did not start")
        self._drain = subprocess.Popen(["cat"], stdin=self.proc.stderr, stdout=subprocess.DEVNULL)

    def bucket(self) -> str:
        import boto3

        client = boto3.session.Session(
            aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1"
        ).client("s3", endpoint_url=self.endpoint)
        client.create_bucket(Bucket="bench")
        return "bench"

    def baseline(self, source: Path, mib: int) -> str:
        """boto3's own managed transfer (threads, 8 MiB parts) of the same file: what the server allows."""
        import boto3

        client = boto3.session.Session(
            aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1"
        ).client("s3", endpoint_url=self.endpoint)
        started = time.perf_counter()
        client.upload_file(str(source), "bench", "baseline")
        up = time.perf_counter() - started
        started = time.perf_counter()
        client.download_file("bench", "baseline", str(source) + ".back")
        down = time.perf_counter() - started
        os.unlink(str(source) + ".back")
        client.delete_object(Bucket="bench", Key="baseline")
        rates = f"{mib / up:8.1f} / {mib / down:8.1f} MiB/s"
        return f"S3 server baseline (boto3 upload_file / download_file, {mib} MiB): {rates}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self._drain.wait(30)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def cp_baseline(source: Path, target: Path) -> float:
    started = time.perf_counter()
    shutil.copyfile(source, target)
    with target.open("rb") as fp:
        os.fsync(fp.fileno())
    return time.perf_counter() - started


def tar_baseline(base: Path) -> str:
    """GNU tar creating and extracting the same 2000 small files: the filesystem's own floor."""
    source = base / "tar-source"
    size = write_small_files(source, 2000, 16 * 1024) / MIB
    os.sync()
    started = time.perf_counter()
    subprocess.run(["tar", "-cf", str(base / "t.tar"), "-C", str(source), "."], check=True)
    created = time.perf_counter() - started
    (base / "tar-out").mkdir()
    os.sync()
    started = time.perf_counter()
    subprocess.run(["tar", "-xf", str(base / "t.tar"), "-C", str(base / "tar-out")], check=True)
    extracted = time.perf_counter() - started
    shutil.rmtree(source)
    shutil.rmtree(base / "tar-out")
    (base / "t.tar").unlink()
    return (
        f"small-files baseline (GNU tar -c / -x, {size:.1f} MiB): {size / created:8.1f} / {size / extracted:8.1f} MiB/s"
    )


def bench(base: Path) -> list[str]:
    mib = size_mib()
    rows: list[str] = []
    moto = MotoServer()
    try:
        drivers = {
            "Filesystem": {"driver": "Filesystem", "path": str(base / "store")},
            "S3": {"driver": "S3", "bucket": moto.bucket(), "endpoint": moto.endpoint, "region": "us-east-1"},
        }
        (base / "store").mkdir()
        sample = base / "sample.bin"
        write_big_file(sample, mib)
        cp_seconds = cp_baseline(sample, base / "sample-copy.bin")
        (base / "sample-copy.bin").unlink()
        rows.append(f"disk baseline (copy + fsync of {mib} MiB): {mib / cp_seconds:8.1f} MiB/s")
        rows.append(moto.baseline(sample, mib))
        rows.append(tar_baseline(base))
        for driver, options in drivers.items():
            cases: list[tuple[str, Callable[[Path], int]]] = [
                ("big.bin", lambda p: write_big_file(p, mib)),
                ("many-files", lambda p: write_small_files(p, 2000, 16 * 1024)),
            ]
            for step, (name, make) in enumerate(cases):
                work = base / driver / name
                work.mkdir(parents=True)
                source = work / "source"
                size = make(source) / MIB
                spec = {
                    "options": json.dumps(options),
                    "workspace": str(work / "build"),
                    "source": str(source),
                    "name": name,
                    "step": str(step),
                    "refs": str(work / "refs.json"),
                }
                env = CREDENTIALS if driver == "S3" else {}
                os.sync()  # the source's writeback must not compete with the measured phase
                up = run_child("upload", spec, env)
                os.sync()
                down = run_child("import", {**spec, "workspace": str(work / "deploy")}, env)
                label = f"{driver:10} {name:10} {size:7.1f} MiB"
                rows.append(
                    f"{label}  upload {size / up['seconds']:8.1f} MiB/s (peak RSS {up['peak_rss_mib']:5.1f} MiB)"
                    f"  import {size / down['seconds']:8.1f} MiB/s (peak RSS {down['peak_rss_mib']:5.1f} MiB)"
                    f"  [interpreter + imports {up['start_rss_mib']:4.1f} MiB]"
                )
                shutil.rmtree(work)
    finally:
        moto.stop()
    return rows


def report() -> None:
    parent = os.environ.get("DYNRUNNER_BENCH_DIR")
    with tempfile.TemporaryDirectory(dir=parent, prefix="dynrunner-bench-") as tmp:
        rows = bench(Path(tmp))
    print(f"\nartifact benchmark ({size_mib()} MiB file; 2000 x 16 KiB files), CPU count {os.cpu_count()}")
    for row in rows:
        print("  " + row)


def test_artifact_throughput_and_memory() -> None:
    report()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=["upload", "import"])
    parser.add_argument("--spec")
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(child(args.phase, json.loads(args.spec))))
    else:
        report()
