"""The SVID wait before the first step, against a real Workload API on a unix socket."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynrunner.executor.identity import IdentityError, wait_for_svid
from dynrunner.proto.assignment import IdentityWait
from dynrunner.proto.gitea import Result
from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.workload_api import workload_api

JOB_ID = "spiffe://example.org/ci/owner/repo/build"
WORKFLOW = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - run: echo "ran with an identity"
"""


@pytest.fixture
def socket() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="wl-") as directory:  # short: unix socket paths are limited
        yield Path(directory) / "agent.sock"


async def test_waits_until_the_exact_id_is_issued(socket: Path) -> None:
    lines: list[str] = []
    with workload_api(socket, ["spiffe://example.org/other", JOB_ID], issue_after_s=0.6) as api:
        waited = await wait_for_svid(JOB_ID, str(socket), 10, lines.append)
    assert 0.5 <= waited < 5
    assert api.requests >= 2
    assert lines[0] == f"Waiting up to 10s for workload identity {JOB_ID}"
    assert lines[-1].startswith(f"Workload identity {JOB_ID} issued after ")


async def test_another_id_does_not_count(socket: Path) -> None:
    with workload_api(socket, ["spiffe://example.org/ci/owner/repo/other"]), pytest.raises(IdentityError) as err:
        await wait_for_svid(JOB_ID, f"unix://{socket}", 1, lambda _: None)
    assert str(err.value).startswith(f"workload identity {JOB_ID} not issued within 1s")
    assert "returned spiffe://example.org/ci/owner/repo/other" in str(err.value)


async def test_no_agent_at_all(socket: Path) -> None:
    with pytest.raises(IdentityError, match=r"not issued within 0.5s; last error: "):
        await wait_for_svid(JOB_ID, str(socket), 0.5, lambda _: None)


async def test_job_runs_after_its_identity_is_issued(executor_harness: ExecutorHarness, socket: Path) -> None:
    identity = IdentityWait(enabled=True, workload_api_socket=str(socket), timeout_seconds=10)
    claimed = await executor_harness.claim(WORKFLOW, identity=identity, spiffe_id=JOB_ID)
    with workload_api(socket, [JOB_ID], issue_after_s=0.3):
        assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS
    setup = task.log_rows[: task.steps[0].log_index]
    assert f"Waiting up to 10s for workload identity {JOB_ID}" in setup
    assert "ran with an identity" in task.log_rows


async def test_job_fails_when_the_identity_never_comes(executor_harness: ExecutorHarness, socket: Path) -> None:
    identity = IdentityWait(enabled=True, workload_api_socket=str(socket), timeout_seconds=1)
    claimed = await executor_harness.claim(WORKFLOW, identity=identity, spiffe_id=JOB_ID)
    with workload_api(socket, []):
        assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert any(row.startswith(f"##[error]workload identity {JOB_ID} not issued within 1s") for row in task.log_rows)
    assert "ran with an identity" not in task.log_rows


async def test_the_socket_comes_from_spiffe_endpoint_socket_and_the_wait_is_the_termination_message(
    executor_harness: ExecutorHarness, socket: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend that knows where the Workload API is inside the environment (a Pod's CSI
    volume) sets SPIFFE_ENDPOINT_SOCKET, as for any SPIFFE-aware tool; the executor reports how
    long it waited in its termination message (Kubernetes copies it into the Pod status)."""
    message = tmp_path / "termination-log"
    monkeypatch.setenv("SPIFFE_ENDPOINT_SOCKET", f"unix://{socket}")
    monkeypatch.setenv("DYNRUNNER_TERMINATION_MESSAGE_PATH", str(message))
    identity = IdentityWait(enabled=True, timeout_seconds=10)
    claimed = await executor_harness.claim(WORKFLOW, identity=identity, spiffe_id=JOB_ID)
    with workload_api(socket, [JOB_ID], issue_after_s=0.3):
        assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.SUCCESS
    assert "ran with an identity" in task.log_rows
    waited = json.loads(message.read_text())["identityWaitSeconds"]
    # The SVID comes 0.3 s after the Workload API starts, which may be before or after the executor
    # starts asking: only that it waited, and less than its timeout, is certain.
    assert 0 < waited < identity.timeout_seconds


async def test_without_any_socket_the_job_fails_saying_so(
    executor_harness: ExecutorHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPIFFE_ENDPOINT_SOCKET", raising=False)
    claimed = await executor_harness.claim(
        WORKFLOW, identity=IdentityWait(enabled=True, timeout_seconds=1), spiffe_id=JOB_ID
    )
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.result == Result.FAILURE
    assert any("names no Workload API socket, and SPIFFE_ENDPOINT_SOCKET is not set" in row for row in task.log_rows)
