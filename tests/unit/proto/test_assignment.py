"""The Assignment contract: round trip, version refusal with a readable reason, the
version-independent reporting envelope, and secrets split off for sealing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dynrunner.proto import assignment as A
from dynrunner.proto._gen.dynrunner.assignment.v1 import assignment_pb2 as apb
from dynrunner.proto.gitea import Need, Result, Task

CLAIMED = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def _assignment() -> A.Assignment:
    task = Task(
        id=42,
        workflow_payload=b"name: ci\njobs:\n  build:\n    runs-on: [self-hosted, pod]\n",
        context={"token": "task-token-1", "gitea_runtime_token": "jwt.runtime", "run_id": "7", "event": {"n": 5}},
        secrets={"GITHUB_TOKEN": "task-token-1", "GITEA_TOKEN": "task-token-1", "DEPLOY_KEY": "s3cr3t"},
        needs={"lint": Need(outputs={"ok": "yes"}, result=Result.SUCCESS)},
        vars={"REGION": "eu"},
    )
    return A.Assignment(
        assignment_id="0b6c5f0e-1111-4222-8333-944455556666",
        pool="pod",
        backend="local",
        claimed_at=CLAIMED,
        task=task,
        runner=A.ClaimingRunner(
            id=3, uuid="uuid-3", token="runner-token-3", name="dynrunner-pod-1", labels=("self-hosted", "pod")
        ),
        gitea_url="http://gitea.example:3000",
        job_key="build",
        spiffe_id="spiffe://example.org/ci/owner/repo/build",
        deadline=CLAIMED + timedelta(hours=6),
        executor=A.ExecutorOptions(
            workspace="/workspace",
            artifacts=A.ArtifactStoreOptions(driver="Filesystem", path="/artifacts"),
            identity=A.IdentityWait(enabled=True, workload_api_socket="unix:///run/agent.sock", timeout_seconds=60),
            outputs_total_limit_bytes=1 << 20,
        ),
    )


def test_round_trip_is_exact():
    a = _assignment()
    assert A.decode(A.encode(a)) == a


def test_encoding_is_deterministic():
    assert A.encode(_assignment()) == A.encode(_assignment())


def test_unknown_major_version_is_refused_with_reason():
    data = A.encode(_assignment().replace(version=2))
    with pytest.raises(A.AssignmentError, match=r"assignment version 2 is not supported .* understands version 1"):
        A.decode(data)
    envelope = A.decode_envelope(data)
    assert (envelope.version, envelope.task_id, envelope.runner.uuid, envelope.gitea_url) == (
        2,
        42,
        "uuid-3",
        "http://gitea.example:3000",
    )


def test_garbage_is_refused():
    with pytest.raises(A.AssignmentError, match="not a valid"):
        A.decode(b"\xff\xff\xff")
    with pytest.raises(A.AssignmentError, match="nothing can be reported"):
        A.decode_envelope(apb.Assignment(version=1).SerializeToString())


def test_missing_required_fields_are_refused():
    with pytest.raises(A.AssignmentError, match="lacks"):
        A.decode(apb.Assignment(version=1, assignment_id="x").SerializeToString())


def test_split_removes_every_secret_and_merge_restores():
    a = _assignment()
    public, parts = A.split_secrets(a)
    blob = A.encode(public)
    for secret in (b"s3cr3t", b"task-token-1", b"jwt.runtime", b"runner-token-3"):
        assert secret not in blob
    assert public.task.context == {"run_id": "7", "event": {"n": 5}}
    assert A.merge_secrets(public, parts) == a


def test_job_key_rule():
    assert A.JOB_KEY_RE.match("build_1-x")
    for bad in ("1build", "build.x", "", "build job", "a/b"):
        assert not A.JOB_KEY_RE.match(bad)
