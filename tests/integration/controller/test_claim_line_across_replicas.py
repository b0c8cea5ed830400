"""A job claimed by one replica and launched by another: its log has one writer at a time.

Issue 18, item 6: with several replicas, the claiming replica held its claim's stage line back
for its own launcher, but another replica's launcher took the assignment; that launcher had
nothing to take along, and the claimer's timer wrote the line a second later at index 0 and
then at Gitea's ack — inside the executor's log, in place of one of its rows. Here replica A
only claims and replica B only launches (one assignment log, one sealing key), as the real
parts on virtual time: claimer, launcher and start followers, the Gitea double's engine
in-process, an executor that reports its rows across two seconds.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.assignments.finalize_records import FinalizeRecordStore
from dynrunner.controller.assignments.launched import LaunchedRecord
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.launching.launcher import Launcher
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import Assignment
from dynrunner.proto.gitea import LogRow, Result, RunnerCredentials, TaskState
from tests.fixtures.assignments_memory import MemoryAssignmentLog
from tests.fixtures.backend_memory import MemoryBackend, MemoryWorld
from tests.fixtures.claim_side import ClaimSide
from tests.fixtures.gitea_inprocess import InProcessGitea
from tests.fixtures.kv_memory import MemoryKeyValue
from tests.fixtures.virtual_time import virtual_time

WORKFLOW = "on: push\njobs:\n  build:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: true\n"
EXECUTOR_ROWS = ["step one runs", "step one done", "Job succeeded"]


def test_a_claim_line_is_written_once_before_the_executor_whichever_replica_launches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1, profile="1.26")

    async def scenario() -> int:
        gitea = InProcessGitea(double, asyncio.get_running_loop())

        async def executor(assignment: Assignment) -> int:
            """Reports as the executor does: from Gitea's ack index, its last row two seconds
            after its first (a step that runs), then the final state."""
            client = gitea.client(RunnerCredentials(assignment.runner.uuid, assignment.runner.token))
            task_id = assignment.task.id
            at = await client.update_log(task_id, 0, [])
            at = await client.update_log(task_id, at, [LogRow(datetime.now(UTC), row) for row in EXECUTOR_ROWS[:2]])
            await asyncio.sleep(2.0)
            await client.update_log(task_id, at, [LogRow(datetime.now(UTC), EXECUTOR_ROWS[2])], no_more=True)
            await client.update_task(TaskState(id=task_id, result=Result.SUCCESS, stopped_at=datetime.now(UTC)))
            return 0

        log = MemoryAssignmentLog(ack_wait_s=60.0, max_deliver=5)
        world = MemoryWorld(executor, pull_s=lambda _: 0.0)
        side_a = ClaimSide(gitea, double.registration_token, capacity=1)
        [claimer_a] = side_a.claimers(log, loops=1)
        capacity_b = Capacity(side_a.settings.pool, 1)
        launcher_b = Launcher(
            side_a.settings.pool,
            backend=MemoryBackend(side_a.settings.pool, world),
            source=log,
            sealer=side_a.sealer,  # one sealing key for all replicas
            record=LaunchedRecord(MemoryKeyValue(), "launched"),  # type: ignore[arg-type]
            records=FinalizeRecordStore(MemoryKeyValue(), side_a.sealer, "finalize"),  # type: ignore[arg-type]
            gitea=gitea.client(),  # type: ignore[arg-type]
            capacity=capacity_b,
            metrics=side_a.metrics,
        )
        claiming = asyncio.create_task(claimer_a.run())
        launching = asyncio.create_task(launcher_b.run())
        run_id = double.submit("owner/repo", WORKFLOW).id
        for _ in range(600):
            await asyncio.sleep(1.0)
            if double.jobs(run_id)[0].status == "success":
                break
        await asyncio.sleep(120.0)  # long enough for any line still held back anywhere
        claimer_a.stop()
        await claiming
        launching.cancel()
        await asyncio.gather(launching, return_exceptions=True)
        task_id: int = double.jobs(run_id)[0].task_id
        return task_id

    caplog.set_level(logging.WARNING, logger="dynrunner")
    try:
        with virtual_time() as runner:
            task_id = runner.run(scenario())
        view: Any = double.task(task_id)
    finally:
        double.close()
    rows = list(view.log_rows)
    claimed = [r for r in rows if r.startswith("[dynrunner] claimed by pool local as runner ")]
    assert len(claimed) == 1, rows
    assert rows[0] == claimed[0], rows  # first, before every other line
    assert rows[-len(EXECUTOR_ROWS) :] == EXECUTOR_ROWS, rows  # the executor's rows, none replaced
    assert all(r.startswith("[dynrunner] ") for r in rows[: -len(EXECUTOR_ROWS)]), rows
    assert view.status == "success"
    assert not [r.getMessage() for r in caplog.records if "stage line not written" in r.getMessage()]
