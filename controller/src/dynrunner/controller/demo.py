"""`dynrunner-controller demo`: the whole flow on this machine, checking its own results.

It starts the bundled Gitea emulator (`dynrunner-gitea-double serve --profile 1.26`, a
separate program: the controller never imports it), a controller with an embedded NATS and the `local`
backend, submits every workflow in `docs/examples/` through the emulator's admin API,
cancels the runs its expectations ask to cancel, prints each job's log and result, and
exits 0 only if every result matches `<example>.expected.yaml`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from dynrunner.controller.app import Controller
from dynrunner.controller.config.model import ControllerConfig
from dynrunner.controller.infra.logs import configure_logging

LABELS = ["self-hosted", "local"]
DONE = {"success", "failure", "cancelled", "skipped"}
RUN_TIMEOUT_S = 90.0
REAP_TIMEOUT_S = 30.0
EMULATOR = "dynrunner-gitea-double"
EMULATED_GITEA = "1.26"
"""The Gitea release the emulator answers as by default: the one most users run (docs/compatibility.md)."""
EXECUTOR = "dynrunner-executor"


class DemoError(Exception):
    """The demo cannot run (a missing program, the emulator did not start)."""


@dataclass
class Example:
    name: str
    workflow: str
    expected: dict[str, Any]
    run_id: int = 0
    run: dict[str, Any] = field(default_factory=dict)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[str, list[str]] = field(default_factory=dict)
    cancelled: bool = False


def main(
    *, examples: Path | None = None, keep: bool = False, verbose: bool = False, gitea: str = EMULATED_GITEA
) -> int:
    configure_logging("info" if verbose else "warning", json=False)
    if not verbose:
        logging.getLogger("nats").setLevel(logging.ERROR)
    try:
        return asyncio.run(Demo(examples or default_examples(), keep=keep, gitea=gitea).run())
    except DemoError as err:
        print(f"demo: {err}", file=sys.stderr)
        return 2


def default_examples() -> Path:
    """`docs/examples/` of the source tree this controller runs from."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "docs" / "examples"
        if candidate.is_dir() and any(candidate.glob("*.expected.yaml")):
            return candidate
    raise DemoError("docs/examples/ was not found next to this installation; pass --examples DIR")


def program(name: str) -> str:
    """A program installed beside this Python (the same virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise DemoError(f"{name} is not installed (run `make venv`)")
    return found


def load_examples(directory: Path) -> list[Example]:
    found = []
    for expected_file in sorted(directory.glob("*.expected.yaml")):
        name = expected_file.name.removesuffix(".expected.yaml")
        workflow_file = directory / f"{name}.yml"
        if not workflow_file.is_file():
            raise DemoError(f"{expected_file} has no workflow {workflow_file.name} beside it")
        expected = yaml.safe_load(expected_file.read_text())
        if not isinstance(expected, dict) or "result" not in expected or not isinstance(expected.get("jobs"), dict):
            raise DemoError(f"{expected_file} must give `result` and `jobs`")
        found.append(Example(name, workflow_file.read_text(), expected))
    if not found:
        raise DemoError(f"no examples (<name>.yml with <name>.expected.yaml) in {directory}")
    return found


class Demo:
    def __init__(self, examples_dir: Path, *, keep: bool, gitea: str = EMULATED_GITEA) -> None:
        self.examples = load_examples(examples_dir)
        self.keep = keep
        self.gitea = gitea
        self.workdir = Path(tempfile.mkdtemp(prefix="dynrunner-demo-"))
        self.admin = ""

    async def run(self) -> int:
        started = time.monotonic()
        executor = program(EXECUTOR)
        emulator = await self._start_emulator()
        try:
            info = json.loads(await self._first_line(emulator))
            self.admin = f"{info['url']}/_double"
            cfg = self._config(info["url"], info["registration_token"], executor)
            controller = Controller(cfg)
            stop = asyncio.Event()
            running = asyncio.create_task(controller.run(stop), name="controller")
            try:
                await self._until_ready(controller, running)
                async with aiohttp.ClientSession() as http:
                    await self._submit_all(http)
                    await self._wait_all(http)
                await self._until_reaped(controller)
            finally:
                stop.set()
                await running
                await self._remove_leftovers(controller)
        finally:
            await self._stop(emulator)
        ok = self._report(time.monotonic() - started)
        if self.keep:
            print(f"state kept in {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return 0 if ok else 1

    # -- the pieces ------------------------------------------------------------------------

    async def _start_emulator(self) -> asyncio.subprocess.Process:
        log = (self.workdir / "gitea-emulator.log").open("wb")
        with log:
            return await asyncio.create_subprocess_exec(
                program(EMULATOR),
                "serve",
                "--state-dir",
                str(self.workdir / "gitea"),
                "--port",
                "0",
                "--profile",
                self.gitea,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )

    async def _first_line(self, proc: asyncio.subprocess.Process) -> str:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
        except TimeoutError:
            line = b""
        if not line:
            tail = (self.workdir / "gitea-emulator.log").read_text(errors="replace")[-2000:]
            raise DemoError(f"the Gitea emulator did not start:\n{tail}")
        return line.decode()

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    def _config(self, url: str, token: str, executor: str) -> ControllerConfig:
        return ControllerConfig.model_validate(
            {
                "gitea": {
                    "url": url,
                    "registrationToken": token,
                    "fetchIntervalSeconds": 0.1,
                    "fetchIntervalMaxSeconds": 0.5,
                },
                "pools": [
                    {
                        "name": "local",
                        "labels": LABELS,
                        "maxConcurrency": 4,
                        "backend": {"kind": "local", "executorCommand": [executor]},
                    }
                ],
                "artifacts": {"driver": "Filesystem", "path": str(self.workdir / "artifacts")},
                "metrics": {"address": ""},
                "logging": {"json": False},
                "stateDir": str(self.workdir / "controller"),
            }
        )

    async def _until_ready(self, controller: Controller, running: asyncio.Task[None]) -> None:
        ready = asyncio.create_task(controller.ready.wait())
        done, _ = await asyncio.wait({ready, running}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if running in done:
            ready.cancel()
            await running
        if ready not in done:
            ready.cancel()
            raise DemoError("the controller did not start within 60s")
        print(f"controller running: pool local (labels {', '.join(LABELS)}), embedded NATS, local backend")

    async def _until_reaped(self, controller: Controller) -> None:
        """Let the reaper finish: a cancelled job's executor stops at its next report."""
        deadline = time.monotonic() + REAP_TIMEOUT_S
        while any(pool.capacity.in_use for pool in controller.pools.values()):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.1)

    async def _remove_leftovers(self, controller: Controller) -> None:
        """A real controller leaves running jobs alone when it stops; the demo leaves nothing."""
        for pool in controller.pools.values():
            for env in await pool.backend.list_owned():
                await pool.backend.delete(env)

    async def _submit_all(self, http: aiohttp.ClientSession) -> None:
        for example in self.examples:
            body = {
                "repository": f"demo/{example.name}",
                "workflow": example.workflow,
                "workflow_file": f"{example.name}.yml",
                "secrets": example.expected.get("secrets") or {},
            }
            run = await self._call(http, "POST", "/runs", body)
            example.run_id = int(run["id"])
            print(f"submitted {example.name}.yml as run {example.run_id} ({len(run['jobs'])} jobs)")

    async def _wait_all(self, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        waiting = list(self.examples)
        while waiting:
            for example in list(waiting):
                example.run = await self._call(http, "GET", f"/runs/{example.run_id}")
                example.jobs = example.run["jobs"]
                await self._maybe_cancel(http, example)
                if example.run["status"] in DONE:
                    await self._collect_logs(http, example)
                    waiting.remove(example)
            if waiting and time.monotonic() > deadline:
                for example in waiting:
                    await self._collect_logs(http, example)
                break
            await asyncio.sleep(0.2)

    async def _maybe_cancel(self, http: aiohttp.ClientSession, example: Example) -> None:
        when: dict[str, str] = example.expected.get("cancel_when_log_contains") or {}
        if example.cancelled or not when:
            return
        for job in example.jobs:
            needle = when.get(job["name"])
            if needle is None or not job["task_id"]:
                continue
            task = await self._call(http, "GET", f"/tasks/{job['task_id']}")
            if any(needle in row for row in task["log_rows"]):
                await self._call(http, "POST", f"/runs/{example.run_id}/cancel")
                example.cancelled = True
                print(f"cancelled run {example.run_id} ({example.name}) while job {job['name']} was running")
                return

    async def _collect_logs(self, http: aiohttp.ClientSession, example: Example) -> None:
        for job in example.jobs:
            rows: list[str] = []
            if job["task_id"]:
                rows = (await self._call(http, "GET", f"/tasks/{job['task_id']}"))["log_rows"]
            example.logs[job["name"]] = rows

    async def _call(self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None) -> Any:
        async with http.request(method, self.admin + path, json=body) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise DemoError(f"{method} {path}: {data.get('error', resp.status)}")
            return data

    # -- the verdict -------------------------------------------------------------------------

    def _report(self, elapsed: float) -> bool:
        all_ok = True
        for example in self.examples:
            problems = check(example)
            all_ok &= not problems
            status = example.run.get("status", "unknown")
            mark = "ok" if not problems else "MISMATCH"
            want = example.expected["result"]
            print(f"\n=== {example.name}.yml: run {example.run_id} {status} (expected {want}) {mark}")
            for job in example.jobs:
                print(f"--- job {job['name']}: {job['status']}")
                for row in example.logs.get(job["name"], []):
                    print(f"    | {row}")
            for problem in problems:
                print(f"  ! {problem}")
        verdict = "every result is the expected one" if all_ok else "some results differ from the expected ones"
        print(f"\ndemo: {len(self.examples)} workflows in {elapsed:.1f}s: {verdict}")
        return all_ok


def check(example: Example) -> list[str]:
    """What differs between the run and its expectations (empty: all as expected)."""
    problems = []
    expected = example.expected
    status = example.run.get("status")
    if status != expected["result"]:
        problems.append(f"the run ended {status!r}, expected {expected['result']!r}")
    jobs = {job["name"]: job for job in example.jobs}
    for name, want in expected["jobs"].items():
        job = jobs.get(name)
        if job is None:
            problems.append(f"no job named {name!r} (jobs: {', '.join(jobs)})")
            continue
        if job["status"] != want.get("result"):
            problems.append(f"job {name}: {job['status']!r}, expected {want.get('result')!r}")
        text = "\n".join(example.logs.get(name, []))
        for needle in want.get("log_contains") or []:
            if needle not in text:
                problems.append(f"job {name}: the log lacks {needle!r}")
        for needle in want.get("log_lacks") or []:
            if needle in text:
                problems.append(f"job {name}: the log shows {needle!r}")
    for name in jobs:
        if name not in expected["jobs"]:
            problems.append(f"job {name!r} is not in the expectations")
    return problems
