"""Sample assignments for the infrastructure tests."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from dynrunner.controller.assignments import AssignmentLog
from dynrunner.controller.registrations_store import ArmedRegistration
from dynrunner.proto.assignment import Assignment, ClaimingRunner
from dynrunner.proto.gitea import Task

TASK_SECRET = "deploy-secret-W8k"
RUNNER_TOKEN = "runner-token-J3q"

LogFactory = Callable[..., Awaitable[AssignmentLog]]


def make_assignment(pool: str = "pod", task_id: int = 1, assignment_id: str | None = None) -> Assignment:
    return Assignment(
        assignment_id=assignment_id or str(uuid.uuid4()),
        pool=pool,
        backend="local",
        claimed_at=datetime.now(UTC),
        task=Task(id=task_id, context={"token": "task-token-Vv1", "repository": "o/r"}, secrets={"KEY": TASK_SECRET}),
        runner=ClaimingRunner(id=task_id, uuid=f"uuid-{task_id}", token=RUNNER_TOKEN, name=f"r-{task_id}"),
        gitea_url="http://gitea:3000",
        job_key="build",
    )


ARMED_TOKEN = "armed-runner-token-Yx4"


def registration(n: int = 1) -> ArmedRegistration:
    return ArmedRegistration(
        id=n,
        uuid=f"0b6c5f0e-0000-4000-8000-00000000000{n}",
        token=ARMED_TOKEN,
        name=f"dynrunner-pod-{n}",
        labels=("self-hosted", "pod"),
        created_at=datetime(2026, 11, 29, 10, n, tzinfo=UTC),
    )
