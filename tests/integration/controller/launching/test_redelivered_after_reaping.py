"""An assignment delivered again after its job ended and its environment was reaped (the
controller that launched it died before it acknowledged) is not run again, and is not a
cancelled job: its result was counted when it was reaped."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dynrunner.controller.assignments.finalize_records import FinalizeRecord
from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.controller.claiming.build import ClaimSettings, build_assignment
from dynrunner.controller.claiming.registrations_store import ArmedRegistration
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.controller.launching.launcher import Launcher
from dynrunner.controller.reporting.finalize import finalize_task
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import Assignment
from dynrunner.proto.gitea import GiteaClient, Result, RunnerCredentials
from tests.fixtures.deliveries import FakeDelivery
from tests.fixtures.harness import fake_executor_command
from tests.fixtures.nats import MemoryFinalizeRecords, MemoryLaunchRecord

WORKFLOW = "on: push\njobs:\n  build:\n    runs-on: [self-hosted]\n    steps:\n      - run: echo\n"
SEALER = Sealer(b"s" * 32)


async def claimed(gitea: GiteaDouble) -> Assignment:
    base = GiteaClient(gitea.url)
    info = await base.register(
        name="r", registration_token=gitea.registration_token, labels=["self-hosted"], ephemeral=True
    )
    gitea.submit("owner/repo", WORKFLOW)
    fetched = await base.with_credentials(RunnerCredentials(info.uuid, info.token)).fetch_task(0)
    assert fetched.task is not None
    reg = ArmedRegistration(info.id, info.uuid, info.token, info.name, ("self-hosted",), datetime.now(UTC))
    return build_assignment(
        fetched.task,
        assignment_id="5f0c2d7e-0000-4000-8000-00000000000b",
        claimed_at=datetime.now(UTC),
        runner=reg,
        settings=ClaimSettings(pool="local", backend="local", gitea_url=gitea.url),
    )


async def test_a_redelivery_after_the_job_succeeded_and_was_reaped_is_not_run_nor_counted_cancelled(
    gitea: GiteaDouble, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynrunner")
    a = await claimed(gitea)
    client = GiteaClient(gitea.url).with_credentials(RunnerCredentials(a.runner.uuid, a.runner.token))
    await finalize_task(client, a.task.id, Result.SUCCESS, ["done"])  # the executor's final report
    records = MemoryFinalizeRecords()
    await records.put(FinalizeRecord.of(a))
    await records.delete(a.assignment_id)  # the reaper deleted the environment and consumed the record
    capacity, metrics = Capacity("local", 2), Metrics()
    launcher = Launcher(
        "local",
        backend=LocalBackend("local", tmp_path / "root", fake_executor_command()),
        source=None,  # type: ignore[arg-type]
        sealer=SEALER,
        record=MemoryLaunchRecord(),  # still "launching": the launcher died before it recorded done
        records=records,
        gitea=GiteaClient(gitea.url),
        capacity=capacity,
        metrics=metrics,
    )
    delivery = FakeDelivery(SEALER.seal_assignment(a), num_delivered=2, max_deliver=5)  # delivered a second time
    await launcher._launch(delivery)  # type: ignore[arg-type]

    assert delivery.calls == ["ack"]
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").iterdir())
    assert gitea.task(a.task.id).status == "success"
    assert not capacity.holds(a.assignment_id)
    assert metrics.sample("dynrunner_job_results_total", pool="local", result="cancelled") is None
    assert "lost its runner" not in caplog.text
    assert "after its job ended" in caplog.text
