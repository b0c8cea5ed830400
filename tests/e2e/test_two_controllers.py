"""Two controllers on one queue: two installations (distinct pool names, the same labels, each
with its own NATS) claim from one Gitea. On Gitea ≤ 1.26 their claim loops lose races to each
other, and a lost race answers "no task" with the latest tasks_version (issue 10, item 3):
every job must still be claimed exactly once, with no free slot left idle for long while a
job waits."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import build_config, fake_executor_command, in_process

JOBS_PER_RUN = 10
RUNS = 20
SLOTS = 8
LONGEST_IDLE_SLOT_S = 20.0


def ten_jobs(run: int) -> str:
    jobs = "".join(
        f"  r{run}j{i}:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: 'true'\n"
        for i in range(JOBS_PER_RUN)
    )
    return f"on: push\njobs:\n{jobs}"


@dataclass
class Watch:
    """How long a controller's free slots stay unused while jobs wait in Gitea: sampled per
    controller, from the assignments its pool's capacity holds (a new one is a claim)."""

    seen: set[str] = field(default_factory=set)
    last_claim: float = field(default_factory=time.monotonic)
    idle_since: float | None = None
    longest_idle_s: float = 0.0

    def sample(self, waiting: int, capacity: Capacity) -> None:
        now = time.monotonic()
        held = capacity.held()
        if held - self.seen:
            self.seen |= held
            self.last_claim = now
        if waiting and capacity.in_use < capacity.limit:
            self.idle_since = self.idle_since if self.idle_since is not None else now
            self.longest_idle_s = max(self.longest_idle_s, now - max(self.idle_since, self.last_claim))
        else:
            self.idle_since = None


def starts(state: Path) -> list[str]:
    """Task ids the fake executor started under a controller's state directory."""
    log = state / "local" / "starts.log"
    return [line.split()[1] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("gitea_profile", ["1.26", "main"])
async def test_two_controllers_racing_for_one_queue_claim_every_job_once(gitea: GiteaDouble, tmp_path: Path) -> None:
    controllers = []
    for name in ("east", "west"):
        state = tmp_path / name
        pool = {
            "name": name,
            "labels": ["self-hosted", "local"],
            "maxConcurrency": SLOTS,
            "backend": {"kind": "local", "executorCommand": fake_executor_command()},
        }
        cfg = build_config(
            gitea_url=gitea.url,
            registration_token=gitea.registration_token,
            state_dir=state,
            nats_url=None,
            pools=[pool],
        )
        controllers.append((name, state, cfg))
    watches = {"east": Watch(), "west": Watch()}
    async with in_process(controllers[0][2]) as east, in_process(controllers[1][2]) as west:
        capacities = {"east": east.controller.pools["east"].capacity, "west": west.controller.pools["west"].capacity}
        runs = [gitea.submit("acme/app", ten_jobs(r)).id for r in range(RUNS)]
        total = RUNS * JOBS_PER_RUN
        deadline = time.monotonic() + 240
        while (counts := gitea.job_counts()).get("success", 0) < total:
            for name, watch in watches.items():
                watch.sample(counts.get("waiting", 0), capacities[name])
            longest = max(w.longest_idle_s for w in watches.values())
            assert time.monotonic() < deadline, f"jobs left after 240 s: {counts}; longest idle slot {longest:.1f} s"
            await asyncio.sleep(0.1)
    tasks = [job.task_id for run in runs for job in gitea.jobs(run)]
    assert len(tasks) == total and 0 not in tasks
    assert len(set(tasks)) == total  # each job its own task: claimed once
    ran = Counter(starts(controllers[0][1]) + starts(controllers[1][1]))
    assert sorted(int(t) for t in ran) == sorted(tasks) and set(ran.values()) == {1}  # each ran once, somewhere
    names = {r.id: r.name for r in gitea.runners(include_deleted=True)}
    by_pool = Counter(names[gitea.task(t).runner_id].split("-")[1] for t in tasks)
    idle = {name: round(w.longest_idle_s, 1) for name, w in watches.items()}
    print(
        f"\n{total} jobs over two controllers ({dict(by_pool)}); "
        f"longest a free slot stayed unused while jobs waited: {idle} s"
    )
    assert all(w.longest_idle_s < LONGEST_IDLE_SLOT_S for w in watches.values()), idle
