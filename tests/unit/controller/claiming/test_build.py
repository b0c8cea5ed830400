"""Building the Assignment for a claimed task (pure)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from dynrunner.controller.assignments.finalize_records import FinalizeRecord
from dynrunner.controller.backends.base import Diagnosis, FailureReason, Observation, Phase
from dynrunner.controller.claiming.build import ClaimSettings, build_assignment, job_timeout_minutes
from dynrunner.controller.claiming.registrations_store import ArmedRegistration
from dynrunner.controller.contract import ContractError
from dynrunner.controller.reaping.reaper import failure_report, mask_secrets
from dynrunner.proto.assignment import ArtifactStoreOptions, ExecutorOptions
from dynrunner.proto.gitea import Task

NOW = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
REG = ArmedRegistration(
    id=7, uuid="uuid-7", token="tok-7", name="dynrunner-pod-abc", labels=("self-hosted",), created_at=NOW
)
SETTINGS = ClaimSettings(
    pool="pod",
    backend="local",
    gitea_url="https://gitea.example.com",
    trust_domain="example.org",
    default_timeout_minutes=360,
    deadline_grace=timedelta(minutes=5),
    executor=ExecutorOptions(artifacts=ArtifactStoreOptions(driver="Filesystem", path="/a")),
)


def payload(job: str = "build", extra: str = "") -> bytes:
    head = f"name: ci\non: push\njobs:\n  {job}:\n    runs-on: [self-hosted]\n"
    return f"{head}{extra}    steps:\n      - run: x\n".encode()


def task(**context: object) -> Task:
    ctx = {"job": "build", "repository": "Acme/Web", "token": "task-token"}
    ctx.update(context)
    return Task(id=99, workflow_payload=payload(), context=ctx, secrets={"S": "v"})


def test_assignment_fields() -> None:
    a = build_assignment(task(), assignment_id="aid-1", claimed_at=NOW, runner=REG, settings=SETTINGS)
    assert a.assignment_id == "aid-1" and a.pool == "pod" and a.backend == "local"
    assert a.claimed_at == NOW
    assert a.runner.id == 7 and a.runner.uuid == "uuid-7" and a.runner.token == "tok-7"
    assert a.gitea_url == "https://gitea.example.com"
    assert a.job_key == "build"
    assert a.spiffe_id == "spiffe://example.org/ci/acme/web/build"
    assert a.deadline == NOW + timedelta(minutes=365)
    assert a.executor.artifacts.driver == "Filesystem"
    assert a.task.secrets == {"S": "v"}
    assert a.version == 1


def test_a_pool_with_ref_in_spiffe_id_names_the_ref() -> None:
    settings = dataclasses.replace(SETTINGS, ref_in_spiffe_id=True)
    a = build_assignment(task(ref="refs/heads/main"), assignment_id="a", claimed_at=NOW, runner=REG, settings=settings)
    assert a.spiffe_id == "spiffe://example.org/ci/acme/web/build/refs/heads/main"
    with pytest.raises(ContractError, match="no git ref"):
        build_assignment(task(), assignment_id="a", claimed_at=NOW, runner=REG, settings=settings)


def test_invalid_job_key_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match="not a valid job key"):
        build_assignment(task(job="3d"), assignment_id="a", claimed_at=NOW, runner=REG, settings=SETTINGS)


@pytest.mark.parametrize(
    ("extra", "minutes"),
    [
        ("", 360),
        ("    timeout-minutes: 30\n", 30),
        ("    timeout-minutes: '45'\n", 45),
        ("    timeout-minutes: 2.5\n", 2),
        ("    timeout-minutes: ${{ matrix.t }}\n", 360),
        ("    timeout-minutes: 0\n", 360),
        ("    timeout-minutes: true\n", 360),
    ],
)
def test_job_timeout_minutes(extra: str, minutes: int) -> None:
    assert job_timeout_minutes(payload(extra=extra), 360) == minutes


def test_job_timeout_minutes_of_unreadable_payloads() -> None:
    assert job_timeout_minutes(None, 10) == 10
    assert job_timeout_minutes(b"{{{ not yaml", 10) == 10
    assert job_timeout_minutes(b"- a list", 10) == 10


def test_masking_covers_every_secret_and_each_line() -> None:
    a = build_assignment(
        Task(
            id=1,
            context={"job": "b", "repository": "o/r", "token": "TASKTOKEN", "gitea_runtime_token": "RUNTIME"},
            secrets={"MULTI": "line-one\nline-two", "ONE": "x"},
        ),
        assignment_id="a",
        claimed_at=NOW,
        runner=REG,
        settings=SETTINGS,
    )
    text = "TASKTOKEN RUNTIME tok-7 line-one line-two x"
    assert mask_secrets(text, FinalizeRecord.of(a).masks) == "*** *** *** *** *** x"


def test_failure_report_masks_the_output_tail() -> None:
    a = build_assignment(task(), assignment_id="a", claimed_at=NOW, runner=REG, settings=SETTINGS)
    obs = Observation(Phase.FAILED, Diagnosis(FailureReason.KILLED, "killed by SIGKILL", "using tok-7 and task-token"))
    report = failure_report(obs, FinalizeRecord.of(a).masks)
    assert report.splitlines()[0] == "killed by SIGKILL [killed]"
    assert "tok-7" not in report and "task-token" not in report and "using *** and ***" in report


@pytest.mark.parametrize("value", ["99999999999999999999", "1e300", ".inf", "'99999999999999999999'", ".nan"])
def test_a_huge_timeout_minutes_is_bounded(value: str) -> None:
    minutes = job_timeout_minutes(payload(extra=f"    timeout-minutes: {value}\n"), 360)
    assert minutes == (360 if value == ".nan" else 7 * 24 * 60)
    t = Task(
        id=1,
        workflow_payload=payload(extra=f"    timeout-minutes: {value}\n"),
        context={"job": "build", "repository": "a/b"},
    )
    a = build_assignment(t, assignment_id="a", claimed_at=NOW, runner=REG, settings=SETTINGS)
    assert a.deadline is not None and a.deadline <= NOW + timedelta(days=7, minutes=5)
