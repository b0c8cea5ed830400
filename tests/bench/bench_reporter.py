"""Log throughput of the executor's reporting path: `Reporter.log` + masking + UpdateLog.

The Gitea double runs as its own process (`dynrunner-gitea-double serve`, Gitea's default
PBKDF2 cost), so this process holds only what an executor holds. With 20 task secrets plus
the task and runtime tokens registered, it measures:
  * masking alone (lines/s through `Masker.mask`, 1 % of lines hold a secret);
  * `Reporter.log` alone (the synchronous cost the engine pays per line);
  * end to end, each run in a fresh process: lines logged across three steps, flushed to
    the double, log closed with ``no_more`` and the task finalized; the double's row count
    is checked (no loss), as is the absence of every secret from what it stored. Printed
    as wall-clock lines/s (bounded by the double, a Python/SQLite server sharing the
    machine) and as lines per executor CPU-second (what the executor itself can sustain),
    with peak RSS; once more with `Reporter.throttle` bounding the backlog.
Figures are printed, never asserted.

    .venv/bin/python tests/bench/bench_reporter.py
    .venv/bin/python -m pytest -q -s tests/bench/bench_reporter.py
DYNRUNNER_BENCH_LINES sets the end-to-end line count (default 200000).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from dynrunner.executor.reporter import Reporter
from dynrunner.proto.gitea import GiteaClient, LogRow, Result, RunnerCredentials
from dynrunner.proto.masking import Masker

LINES = int(os.environ.get("DYNRUNNER_BENCH_LINES", "200000"))
WORDS = ["the", "quick", "fox", "compiled", "src/main.c", "-O2", "warning:", "unused", "variable", "1234", "PASS"]
WORKFLOW = """name: bench
on: push
jobs:
  build:
    runs-on: [self-hosted, pod]
    steps:
      - run: echo 1
      - run: echo 2
      - run: echo 3
"""


class CountingClient(GiteaClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log_requests = 0
        self.task_requests = 0
        self.rows_sent = 0

    async def update_log(self, task_id: int, index: int, rows: Any, **kwargs: Any) -> int:
        self.log_requests += 1
        self.rows_sent += len(rows)
        return await super().update_log(task_id, index, rows, **kwargs)

    async def update_task(self, *args: Any, **kwargs: Any) -> Any:
        self.task_requests += 1
        return await super().update_task(*args, **kwargs)


def task_secrets() -> dict[str, str]:
    values = [secrets.token_hex(20) for _ in range(8)] + [secrets.token_urlsafe(32) for _ in range(8)]
    values += ["hunter2-" + secrets.token_hex(4), "P@ssw0rd!" + secrets.token_hex(3)]
    values += [
        "-----BEGIN KEY-----\n" + secrets.token_urlsafe(48) + "\n-----END KEY-----",
        "db-" + secrets.token_hex(8),
    ]
    return {f"SECRET_{i}": v for i, v in enumerate(values)}


def peak_rss_mib() -> float:
    """VmHWM: the highest resident set size of this process image so far (ru_maxrss would
    include the parent's size at fork time)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def admin(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method="POST" if body is not None else "GET")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def bench_masking(masker: Masker, lines: list[str]) -> None:
    started = time.perf_counter()
    masked = [masker.mask(line) for line in lines]
    seconds = time.perf_counter() - started
    hits = sum("***" in m for m in masked)
    print(f"masking: {len(lines) / seconds:,.0f} lines/s ({len(masker.forms)} masked forms, {hits} lines hit)")


def bench_log_call(masker: Masker, lines: list[str]) -> None:
    rep = Reporter(GiteaClient("http://unused.invalid"), 1, masker)  # never started: log() only
    started = time.perf_counter()
    for line in lines:
        rep.log(line)
    per_line = time.perf_counter() - started
    rep = Reporter(GiteaClient("http://unused.invalid"), 1, masker)
    text = [("\n".join(lines[i : i + 100]) + "\n") for i in range(0, len(lines), 100)]
    started = time.perf_counter()
    for chunk in text:
        rep.log(chunk)
    chunked = time.perf_counter() - started
    print(
        f"Reporter.log: {len(lines) / per_line:,.0f} lines/s one line per call, "
        f"{len(lines) / chunked:,.0f} lines/s in 100-line chunks"
    )


async def bench_end_to_end(url: str, token: str, all_secrets: dict[str, str], chunk: int, throttle: bool) -> dict:
    base = CountingClient(url)
    runner = await base.register(name="bench", registration_token=token, labels=["self-hosted", "pod"], ephemeral=True)
    client = CountingClient(url, RunnerCredentials(runner.uuid, runner.token))
    await asyncio.to_thread(
        admin, url, "/_double/runs", {"repository": "bench/app", "workflow": WORKFLOW, "secrets": all_secrets}
    )
    fetched = await client.fetch_task(0)
    assert fetched.task is not None
    task = fetched.task
    context = task.context or {}
    masker = Masker([*task.secrets.values(), context["token"], context["gitea_runtime_token"]])
    await client.update_log(task.id, 0, [LogRow(time=datetime.now(UTC), content="stage line")])
    leak = [v for k, v in sorted(task.secrets.items()) if k.startswith("SECRET_")][:10]
    base_rss = peak_rss_mib()

    cpu0, started = cpu_s(), time.perf_counter()
    rep = Reporter(client, task.id, masker)
    await rep.start(3)
    lines = iter_lines(LINES, leak)
    per_step = LINES // 3
    for step in range(3):
        rep.step_started(step)
        left = per_step if step < 2 else LINES - 2 * per_step
        while left:
            # One pipe read of up to 100 lines, logged line by line or as one text.
            read = [next(lines) for _ in range(min(100, left))]
            left -= len(read)
            if chunk == 1:
                for line in read:
                    rep.log(line, step=step)
            else:
                rep.log("\n".join(read), step=step)
            if throttle:
                await rep.throttle()
            else:
                await asyncio.sleep(0)
        rep.step_finished(step, Result.SUCCESS)
    logged = time.perf_counter() - started
    finalized = await rep.close(Result.SUCCESS)
    seconds = time.perf_counter() - started
    cpu = cpu_s() - cpu0
    peak_rss = peak_rss_mib()  # before reading the whole log back for the checks below

    view = await asyncio.to_thread(admin, url, f"/_double/tasks/{task.id}")
    stored = view["log_rows"]
    return {
        "lines": LINES,
        "seconds": seconds,
        "logged_s": logged,
        "cpu_s": cpu,
        "log_requests": client.log_requests,
        "rows_per_request": client.rows_sent / max(client.log_requests, 1),
        "task_requests": client.task_requests,
        "finalized": finalized,
        "stored": len(stored),
        "expected": 1 + LINES + 1,  # stage line, the lines, the closing line
        "leaked": [name for name, value in task.secrets.items() if any(value in row for row in stored)],
        "status": view["status"],
        "archived": view["log_archived"],
        "base_rss_mib": base_rss,
        "peak_rss_mib": peak_rss,
    }


def iter_lines(n: int, leak: list[str]) -> Iterator[str]:
    rng = random.Random(7)
    for i in range(n):
        line = " ".join(rng.choice(WORDS) for _ in range(12))
        yield line + " token=" + rng.choice(leak) if i % 100 == 0 else line


def end_to_end_child(spec: str) -> None:
    """One end-to-end run in a fresh process, so its peak RSS is the reporter's own."""
    args = json.loads(spec)
    result = asyncio.run(bench_end_to_end(args["url"], args["token"], args["secrets"], args["chunk"], args["throttle"]))
    print(json.dumps(result))


def report(chunk: int, throttle: bool, r: dict) -> None:
    how = ("one line per call" if chunk == 1 else f"{chunk}-line chunks") + (", throttled" if throttle else "")
    loss = "no loss" if r["stored"] == r["expected"] else "MISMATCH"
    print(
        f"end to end ({how}): {r['lines'] / r['seconds']:,.0f} lines/s wall "
        f"({r['lines']:,} lines in {r['seconds']:.2f}s; logging took {r['logged_s']:.2f}s); "
        f"executor CPU {r['cpu_s']:.2f}s = {r['lines'] / r['cpu_s']:,.0f} lines per CPU-second; "
        f"{r['log_requests']} UpdateLog ({r['rows_per_request']:,.0f} rows each), {r['task_requests']} UpdateTask; "
        f"finalized={r['finalized']}; rows stored {r['stored']:,}/{r['expected']:,} ({loss}); "
        f"secrets leaked: {r['leaked'] or 'none'}; status {r['status']}, archived {r['archived']}; "
        f"peak RSS {r['peak_rss_mib']:.0f} MiB (before reporting {r['base_rss_mib']:.0f} MiB)"
    )


def main() -> None:
    all_secrets = task_secrets()
    tokens = [secrets.token_hex(20), "eyJ" + secrets.token_urlsafe(120)]
    masker = Masker([*all_secrets.values(), *tokens])
    sample = list(iter_lines(100_000, [*all_secrets.values()][:10]))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, 20 secrets + 2 tokens")
    bench_masking(masker, sample)
    bench_log_call(masker, sample)
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [sys.executable, "-m", "dynrunner.doubles.gitea.cli", "serve", "--state-dir", tmp],
            stdout=subprocess.PIPE,
            env={**os.environ, "HOME": tmp},
            text=True,
        )
        try:
            assert server.stdout is not None
            info = json.loads(server.stdout.readline())
            for chunk, throttle in ((1, False), (100, False), (100, True)):
                spec = {"url": info["url"], "token": info["registration_token"], "secrets": all_secrets}
                spec |= {"chunk": chunk, "throttle": throttle}
                out = subprocess.run(
                    [sys.executable, __file__, "--end-to-end", json.dumps(spec)],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                report(chunk, throttle, json.loads(out.stdout.strip().splitlines()[-1]))
        finally:
            server.terminate()
            server.wait(timeout=30)
            if server.stdout is not None:
                server.stdout.close()


def test_reporter_throughput() -> None:
    main()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--end-to-end":
        end_to_end_child(sys.argv[2])
    else:
        main()
