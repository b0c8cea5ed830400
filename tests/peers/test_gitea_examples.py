"""The `make demo` examples (docs/examples/) against real Gitea 1.24, 1.25 and 1.26.

The controller (local backend, embedded NATS, the real executor) registers with the real
Gitea's runner registration token; each example is its own repository of an organisation,
its secrets set through the REST API and its workflow committed through the contents API (a
push). The run's, jobs' and steps' states and the job logs are read back through Gitea's API
(tasks, runs/jobs from 1.25, the web view's JSON on 1.24, job logs) and compared with
`<example>.expected.yaml` by the demo's own `check`. The cancelled example is cancelled through
the web route, as a user would.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from dynrunner.controller.app import Controller
from dynrunner.controller.config import ControllerConfig
from dynrunner.controller.demo import Example, check, load_examples
from tests.fixtures.real_gitea import RealGitea, Run

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
EXECUTOR = str(Path(sys.executable).parent / "dynrunner-executor")
LABELS = ["self-hosted", "local"]
RUN_TIMEOUT_S = 150.0
ORG = "examples"

STEPS: dict[str, dict[str, list[str]]] = {
    # The step states Gitea keeps (as the executor reported them), beside the expectations'
    # results and logs; the same on every release. A step that failed under
    # continue-on-error is shown failed in a job that succeeded.
    "continue-on-error": {"tolerant": ["failure", "success"], "strict": ["failure", "skipped"], "cleanup": ["success"]},
    "cancelled": {"long": ["cancelled"]},
    "artifacts": {"build": ["success"] * 3, "deploy": ["success"] * 2},
    "multi-job": {"build": ["success"] * 2, "test": ["success"], "report": ["success"]},
}


def controller_config(gitea: RealGitea, state_dir: Path) -> ControllerConfig:
    return ControllerConfig.model_validate(
        {
            "gitea": {
                "url": gitea.url,
                "registrationToken": gitea.registration_token,
                "fetchIntervalSeconds": 0.2,
                "fetchIntervalMaxSeconds": 1.0,
            },
            "pools": [
                {
                    "name": "local",
                    "labels": LABELS,
                    "maxConcurrency": 4,
                    "backend": {"kind": "local", "executorCommand": [EXECUTOR]},
                }
            ],
            "artifacts": {"driver": "Filesystem", "path": str(state_dir / "artifacts")},
            "metrics": {"address": ""},
            "logging": {"level": "info", "json": False},
            "stateDir": str(state_dir / "controller"),
        }
    )


async def run_controller(cfg: ControllerConfig, stop: asyncio.Event) -> tuple[Controller, asyncio.Task[None]]:
    controller = Controller(cfg)
    task = asyncio.create_task(controller.run(stop), name="controller")
    ready = asyncio.create_task(controller.ready.wait())
    done, _ = await asyncio.wait({task, ready}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        ready.cancel()
        await task
    assert ready in done, "the controller did not become ready within 60 s"
    return controller, task


def describe(example: Example, run: Run | None) -> str:
    if run is None:
        return f"{example.name}: no run"
    lines = [f"{example.name}: run {run.index} {run.status}"]
    for job in run.jobs:
        steps = ", ".join(f"{s.name!r}={s.status}" for s in job.steps)
        lines.append(f"  job {job.name}: {job.status} [{steps}]")
        lines.extend(f"    | {row}" for row in job.log.splitlines()[-12:])
    return "\n".join(lines)


async def test_every_demo_example_ends_as_expected(real_gitea: RealGitea, tmp_path: Path) -> None:
    gitea = real_gitea
    examples = load_examples(EXAMPLES)
    await asyncio.to_thread(gitea.create_org, ORG)
    repos: dict[str, str] = {}
    for example in examples:
        repo = await asyncio.to_thread(gitea.create_repo, ORG, example.name)
        for name, value in (example.expected.get("secrets") or {}).items():
            await asyncio.to_thread(gitea.set_secret, repo, name, value)
        repos[example.name] = repo

    stop = asyncio.Event()
    controller, running = await run_controller(controller_config(gitea, tmp_path), stop)
    runs: dict[str, Run | None] = {}
    try:
        for example in examples:
            workflow = f".gitea/workflows/{example.name}.yml"
            await asyncio.to_thread(gitea.commit_file, repos[example.name], workflow, example.workflow)
        waiting = {example.name: example for example in examples}
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            for name, example in list(waiting.items()):
                run = await asyncio.to_thread(gitea.read_run, repos[name], logs=not example.cancelled)
                runs[name] = run
                if run is None:
                    continue
                await maybe_cancel(gitea, repos[name], example, run)
                if run.done:
                    del waiting[name]
            await asyncio.sleep(1)
        for name in waiting:
            runs[name] = await asyncio.to_thread(gitea.read_run, repos[name])
    finally:
        stop.set()
        await asyncio.wait_for(running, 60)
        for pool in controller.pools.values():
            for env in await pool.backend.list_owned():
                await pool.backend.delete(env)

    problems: list[str] = []
    for example in examples:
        run = runs.get(example.name)
        if run is None:
            problems.append(f"{example.name}: Gitea made no run")
            continue
        run = await asyncio.to_thread(gitea.read_run, repos[example.name])
        assert run is not None
        runs[example.name] = run
        example.run = {"status": run.status}
        example.jobs = [{"name": job.name, "status": job.status} for job in run.jobs]
        example.logs = {job.name: job.log.splitlines() for job in run.jobs}
        problems += [f"{example.name}: {p}" for p in check(example)]
        for job_name, want in STEPS.get(example.name, {}).items():
            got = [s.status for job in run.jobs if job.name == job_name for s in job.steps]
            if got != want:
                problems.append(f"{example.name}: job {job_name}: steps {got}, expected {want}")
        for job in run.jobs:
            if job.status in ("success", "failure") and "[dynrunner] claimed by pool local as runner" not in job.log:
                problems.append(f"{example.name}: job {job.name}: the log lacks the controller's claim line")
    report = "\n".join(describe(e, runs.get(e.name)) for e in examples)
    assert not problems, f"Gitea {gitea.version}:\n" + "\n".join(problems) + "\n\n" + report


async def maybe_cancel(gitea: RealGitea, repo: str, example: Example, run: Run) -> None:
    """Cancel through the web route once a job's log shows the expectations' line."""
    when: dict[str, str] = example.expected.get("cancel_when_log_contains") or {}
    if example.cancelled or not when or run.done:
        return
    for job in run.jobs:
        needle = when.get(job.name)
        if needle is None or job.status != "running":
            continue
        log: Any = await asyncio.to_thread(gitea.job_log, repo, job.id)
        if needle in log:
            await asyncio.to_thread(gitea.cancel, repo, run)
            example.cancelled = True
            return
