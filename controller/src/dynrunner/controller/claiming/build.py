"""What a claim becomes: the pool's claim settings and the Assignment built from a task (pure).

`build_assignment` is everything the claimer decides about a claimed task before it publishes
it: the job key and SPIFFE ID (`contract`), the deadline from the job's `timeout-minutes` (else
the pool's default), the cache grant, the claiming runner's credentials.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import yaml

from dynrunner.controller import contract
from dynrunner.controller.cache.grants import CacheGrants
from dynrunner.controller.claiming.registrations_store import ArmedRegistration
from dynrunner.proto.assignment import Assignment, ClaimingRunner, ExecutorOptions
from dynrunner.proto.gitea import Task

DEFAULT_TIMEOUT_MINUTES = 180
"""Gitea stops any task after `ENDLESS_TASK_TIMEOUT` (3 h by default); `pools[].jobTimeoutMinutes`."""
MAX_TIMEOUT_MINUTES = 7 * 24 * 60
"""A job's `timeout-minutes` beyond this (as `pools[].jobTimeoutMinutes` allows at most) is cut
to it: the deadline must stay a date, whatever number a workflow writes."""
DEADLINE_GRACE = timedelta(minutes=5)
"""Added to the job's timeout: launching (image pulls, VM boots) happens before the job starts."""
DEFAULT_TRUST_DOMAIN = "dynrunner.local"
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class ClaimSettings:
    pool: str
    backend: str
    gitea_url: str
    fetch_interval_s: float = 0.5
    fetch_interval_max_s: float = 1.0
    request_timeout_s: float = 65.0
    default_timeout_minutes: int = DEFAULT_TIMEOUT_MINUTES
    deadline_grace: timedelta = DEADLINE_GRACE
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    ref_in_spiffe_id: bool = False
    """The pool's `refInSpiffeId`: the job's git ref follows the job key in its SPIFFE ID."""
    executor: ExecutorOptions = field(default_factory=ExecutorOptions)
    cache: CacheGrants | None = None


def job_timeout_minutes(payload: bytes | None, default: int) -> int:
    """`timeout-minutes` of the single job in a task's workflow payload, else `default`.

    An expression (`${{ … }}`) is evaluated by the executor, not here: the controller's
    deadline then uses the default, which only bounds the outer limit. A payload that does not
    mention the key is not parsed at all (Gitea writes the payload with plain keys). A value
    over `MAX_TIMEOUT_MINUTES` (Gitea passes any number through) is cut to it.
    """
    if not payload or b"timeout-minutes" not in payload:
        return default
    try:
        doc = yaml.load(payload, Loader=_Loader)  # a safe loader (C or Python)
        jobs = doc.get("jobs") if isinstance(doc, dict) else None
        job = next(iter(jobs.values())) if isinstance(jobs, dict) and len(jobs) == 1 else None
        value = job.get("timeout-minutes") if isinstance(job, dict) else None
    except yaml.YAMLError:
        return default
    if isinstance(value, bool):
        return default
    if isinstance(value, str) and re.fullmatch(r"\s*(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*", value):
        value = float(value)
    if isinstance(value, int | float) and value > 0 and not math.isnan(value):
        return max(1, round(min(value, MAX_TIMEOUT_MINUTES)))
    return default


def build_assignment(
    task: Task,
    *,
    assignment_id: str,
    claimed_at: datetime,
    runner: ArmedRegistration,
    settings: ClaimSettings,
) -> Assignment:
    """The Assignment for a claimed task (pure). Raises ContractError when the task cannot
    be run under the contract (its message is what the user reads in the job log)."""
    job_key = contract.job_key_of(task)
    owner, repository = contract.repository_of(task)
    ref = contract.ref_of(task) if settings.ref_in_spiffe_id else None
    minutes = job_timeout_minutes(task.workflow_payload, settings.default_timeout_minutes)
    deadline = claimed_at + timedelta(minutes=minutes) + settings.deadline_grace
    executor = settings.executor
    if settings.cache is not None:
        cache = settings.cache.options_for(task, gitea_url=settings.gitea_url, deadline=deadline)
        executor = dataclasses.replace(executor, cache=cache)
    return Assignment(
        assignment_id=assignment_id,
        pool=settings.pool,
        backend=settings.backend,
        claimed_at=claimed_at,
        task=task,
        runner=ClaimingRunner(
            id=runner.id, uuid=runner.uuid, token=runner.token, name=runner.name, labels=runner.labels
        ),
        gitea_url=settings.gitea_url,
        job_key=job_key,
        spiffe_id=contract.spiffe_id(settings.trust_domain, owner, repository, job_key, ref),
        deadline=deadline,
        executor=executor,
    )
