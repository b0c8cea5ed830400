"""Helpers for driving the Gitea double through the real `GiteaClient`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pyqwest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, Result, RunnerCredentials, StepState, TaskState

POD = ("self-hosted", "pod")

# A pyqwest.Client costs ~50 ms to build; the tests share one.
_HTTP: list[pyqwest.Client] = []


def base_client(gitea: GiteaDouble, *, json: bool = False, gzip_requests: bool = False) -> GiteaClient:
    """An unauthenticated client of `gitea` in the given codec."""
    if not _HTTP:
        _HTTP.append(pyqwest.Client())
    return GiteaClient(gitea.url, http_client=_HTTP[0], json=json, gzip_requests=gzip_requests)


async def register(
    gitea: GiteaDouble,
    labels: Sequence[str] = POD,
    *,
    name: str = "runner",
    token: str | None = None,
    ephemeral: bool = False,
    capabilities: Sequence[str] = (),
    json: bool = False,
    gzip_requests: bool = False,
) -> GiteaClient:
    """Register a runner and return a client holding its credentials."""
    base = base_client(gitea, json=json, gzip_requests=gzip_requests)
    info = await base.register(
        name=name,
        registration_token=token or gitea.registration_token,
        labels=list(labels),
        ephemeral=ephemeral,
        capabilities=capabilities,
    )
    return base.with_credentials(RunnerCredentials(info.uuid, info.token))


def now() -> datetime:
    return datetime.now(UTC)


def final_state(task_id: int, result: Result = Result.SUCCESS, steps: int = 1) -> TaskState:
    stamp = now()
    return TaskState(
        id=task_id,
        result=result,
        started_at=stamp,
        stopped_at=stamp,
        steps=[StepState(id=i, result=result, started_at=stamp, stopped_at=stamp) for i in range(steps)],
    )


def workflow(*jobs: str, name: str = "ci") -> str:
    """A workflow text from job blocks (each already indented by four spaces)."""
    return f"name: {name}\non: push\njobs:\n" + "".join(jobs)


def job(job_id: str, runs_on: str = "[self-hosted, pod]", extra: str = "", steps: int = 1) -> str:
    lines = [f"  {job_id}:\n", f"    runs-on: {runs_on}\n"]
    if extra:
        lines.append("".join(f"    {line}\n" for line in extra.strip("\n").split("\n")))
    lines.append("    steps:\n")
    lines.extend(f"      - run: echo {job_id} {i}\n" for i in range(steps))
    return "".join(lines)
