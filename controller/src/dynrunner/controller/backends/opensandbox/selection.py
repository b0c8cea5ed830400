"""Which of the listed sandboxes are a job's, which one is *the* job's, and whether it is an
environment yet (pure functions of listed sandboxes).

Create takes no idempotency key, so two launches of one assignment (two controller replicas,
a redelivery racing a slow create) can each make a sandbox. Every replica then keeps the same
one: the one furthest along (delivered, then staged), then the oldest, then the smallest id —
so a sandbox whose executor runs is never given up for one that has not started — and deletes
the others. A sandbox still `created` (nothing staged in it yet) is not an environment while
its create may still be under way (younger than the start timeout): `find` and `list_owned`
do not show it, as the local backend does not show a directory without its metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from dynrunner.controller import contract
from dynrunner.controller.backends.opensandbox.builders import (
    STAGE_CREATED,
    STAGES,
    is_job_sandbox,
    labels_of,
    stage_of,
)
from dynrunner.controller.backends.opensandbox.diagnosis import SandboxView

_FAR_PAST = datetime.min


def assignment_of(view: SandboxView) -> str:
    return labels_of(view.metadata)[contract.LABEL_ASSIGNMENT_ID]


def by_assignment(views: Iterable[SandboxView], pool: str) -> dict[str, list[SandboxView]]:
    """The pool's job sandboxes, grouped by assignment id (others are ignored)."""
    groups: dict[str, list[SandboxView]] = {}
    for view in views:
        if is_job_sandbox(view.metadata, pool):
            groups.setdefault(assignment_of(view), []).append(view)
    return groups


def _rank(view: SandboxView) -> tuple[int, datetime, str]:
    created = view.created_at.replace(tzinfo=None) if view.created_at is not None else _FAR_PAST
    return (-STAGES.index(stage_of(view.metadata)), created, view.id)


def keeper(views: Iterable[SandboxView]) -> tuple[SandboxView, list[SandboxView]]:
    """The job's sandbox among several, and the duplicates to delete."""
    ranked = sorted(views, key=_rank)
    return ranked[0], ranked[1:]


def is_environment(view: SandboxView, *, now: datetime, start_timeout: timedelta) -> bool:
    """False while a create may still be filling the sandbox (see the module's docstring)."""
    if stage_of(view.metadata) != STAGE_CREATED or view.ended:
        return True
    return view.created_at is not None and now - view.created_at >= start_timeout
