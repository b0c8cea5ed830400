"""Soak, on virtual time: the controller's whole job path through three days of mixed traffic
(claim → assignment → launch → start follow → reap → finalize), with failing environments,
cancellations and Gitea outages. What runs and what stands in: `tests/fixtures/
controller_soak.py` (Gitea: the double's engine in-process; JetStream: the in-memory work
queue and buckets; the backend: the in-memory one that passes the backend conformance suite;
the executor: a coroutine reporting to Gitea as the real one does).

Asserted: every job ended exactly once with the result its kind calls for, no permit leaked,
no supervised loop restarted, and at every idle checkpoint (nights, 6 h apart) every
in-memory structure of the launcher, the start followers, the reaper, the claim loops and
their registrations, the claimed-line buffer, the capacity, the metrics' label sets and the
task list is back to its idle size (within a few label values first seen later, and the
reaper's wait futures that come and go).
"""

from __future__ import annotations

import time
from pathlib import Path

from dynrunner.controller.app import CLAIM_LOOPS
from tests.fixtures.controller_soak import ControllerSoak
from tests.fixtures.virtual_time import virtual_time

HOURS = 72
PER_JOB = (
    "launcher.launches",
    "launcher.launching",
    "starts.followers",
    "starts.retry_after",
    "reaper.seen",
    "reaper.ready_noted",
    "reaper.awaiting_redelivery",
    "reaper.dirty",
    "reaper.reaped",
    "capacity.in_use",
    "capacity.waiters",
    "claimers.claims",
    "log.messages",
    "world.environments",
)
"""Structures that hold something per job in flight: empty when the controller is idle."""
LATE_LABELS = 16
WAITERS = 3


def test_the_whole_job_path_stays_bounded_through_three_days_of_mixed_traffic(tmp_path: Path) -> None:
    soak = ControllerSoak(tmp_path, hours=HOURS)
    started = time.perf_counter()
    try:
        with virtual_time() as runner:
            runner.run(soak.run())
        runs = {r.id: r for r in soak.double.runs()}
        tasks = {job.task_id: run_id for run_id, run in runs.items() for job in run.jobs if job.task_id}
    finally:
        soak.close()
    wall = time.perf_counter() - started
    by_kind: dict[str, int] = {}
    for kind in soak.kinds.values():
        by_kind[kind] = by_kind.get(kind, 0) + 1
    idle = [c for c in soak.checkpoints if round(c.at_h) % 24 in (0, 6)]
    print(
        f"\n{HOURS} h (virtual) in {wall:.1f} s: {len(soak.expected)} jobs {by_kind}, {soak.outages} Gitea outages, "
        f"{soak.gitea.calls['FetchTask']} FetchTask, {soak.gitea.calls['refused']} calls refused while down, "
        f"{soak.log.redelivered} redeliveries, {soak.reaper.sweeps} full sweeps"
    )
    for c in soak.checkpoints:
        print(f"  {c.at_h:5.1f} h: " + ", ".join(f"{k}={v}" for k, v in c.sizes.items() if v))
    assert soak.restarts == {}
    wrong = {
        run_id: (soak.kinds[run_id], want, runs[run_id].status)
        for run_id, want in soak.expected.items()
        if runs[run_id].status != want
    }
    assert wrong == {}
    assert all(n == 1 for n in soak.finals.values()), {t: n for t, n in soak.finals.items() if n != 1}
    assert soak.late_finals == {}, {tasks.get(t): n for t, n in soak.late_finals.items()}
    assert soak.capacity.in_use == 0 and soak.capacity.taken == 0, "a permit leaked"
    assert len(idle) >= 5
    for c in idle:
        grown = {k: c.sizes[k] for k in PER_JOB if c.sizes[k]}
        assert grown == {}, f"at {c.at_h:.0f} h, idle: {grown}"
    # Per-job growth would be hundreds over the run; what may vary is a few label values seen
    # late (a result or reason first met on day 2) and the reaper's wait futures coming and going.
    first = idle[0].sizes
    for c in idle:
        assert c.sizes["registrations.spent"] <= CLAIM_LOOPS, c
        assert c.sizes["metrics.samples"] <= first["metrics.samples"] + LATE_LABELS, c
        assert c.sizes["tasks"] <= first["tasks"] + WAITERS, c
