"""Which of a job's sandboxes is the job's, and when a sandbox is an environment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dynrunner.controller.backends.opensandbox.diagnosis import SandboxView
from dynrunner.controller.backends.opensandbox.selection import by_assignment, is_environment, keeper

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AID = "0b6d7d6e-5a8e-4f0e-9a55-3d7c9a6f0c11"


def box(sandbox_id: str, stage: str = "created", *, at: int = 0, state: str = "Running", **meta: str) -> SandboxView:
    metadata = {
        "dynrunner-assignment-id": AID,
        "dynrunner-task-id": "7",
        "dynrunner-pool": "vm",
        "dynrunner-stage": stage,
        **meta,
    }
    return SandboxView(sandbox_id, state, metadata=metadata, created_at=T0 + timedelta(seconds=at))


def test_the_furthest_along_then_the_oldest_then_the_smallest_id_is_kept() -> None:
    assert keeper([box("b", at=1), box("a", at=2)])[0].id == "b"
    assert keeper([box("b"), box("a")])[0].id == "a"
    kept, dropped = keeper([box("old", at=0), box("staged", "staged", at=5), box("running", "delivered", at=9)])
    assert kept.id == "running" and {v.id for v in dropped} == {"old", "staged"}
    # every replica decides the same, whatever order it listed them in
    views = [box("x", at=3), box("y", "staged", at=4), box("z", "staged", at=4)]
    assert {keeper(order)[0].id for order in (views, views[::-1], views[1:] + views[:1])} == {"y"}


def test_only_the_pools_job_sandboxes_are_grouped() -> None:
    other_pool = box("p", **{"dynrunner-pool": "pod"})
    no_task = box("t", **{"dynrunner-task-id": "x"})
    stranger = SandboxView("s", "Running", metadata={"team": "a"})
    groups = by_assignment([box("a"), box("b"), other_pool, no_task, stranger], "vm")
    assert {aid: [v.id for v in views] for aid, views in groups.items()} == {AID: ["a", "b"]}


def test_a_sandbox_being_filled_is_no_environment_until_its_start_timeout() -> None:
    timeout = timedelta(seconds=600)
    young, now = box("a", at=0), T0 + timedelta(seconds=10)
    assert not is_environment(young, now=now, start_timeout=timeout)
    assert is_environment(young, now=T0 + timeout, start_timeout=timeout)
    assert is_environment(box("a", "staged"), now=now, start_timeout=timeout)
    assert is_environment(box("a", state="Failed"), now=now, start_timeout=timeout)
