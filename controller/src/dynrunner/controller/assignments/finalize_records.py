"""What the controller needs to finalize a task whose environment is gone, kept outside it.

When an environment ends without its executor finalizing the task — or vanishes (a Pod
deleted by hand, its node lost, a microVM that died) — the controller reports on the
executor's behalf with the claiming runner's credential. That credential must not be read
back from the environment: a Pod's Secret is collected with the Pod. So the launcher writes
a *finalize record* before it creates the environment, and the reaper deletes it once the
environment is reaped (a TTL collects records a crash left behind).

A record holds the runner (id, uuid, token), the task id, the values to mask in what the
controller quotes of the executor's output, the job's steps as Gitea knows them at claim (so
a controller that finalizes can say what became of each step) and the runtime token the job
registered with the actions cache (so that registration can be revoked). It is sealed
whole with the controller's key, bound to its assignment id (a record copied under another
id does not open), in the JetStream KV bucket `nats.finalizeBucket`.

It is not the launch record (`launched`): that one names the stream message an assignment
was launched from and must outlive the environment (to refuse replays for as long as a
message could be valid), holds no secret and is read on every delivery; this one holds a
credential and must not outlive the environment. Two lifetimes, two records.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import yaml
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from dynrunner.controller.assignments.log import open_bucket, stored
from dynrunner.controller.cache.grants import runtime_token
from dynrunner.controller.infra.sealing import Sealer, SealingError, dump_sealed, load_sealed
from dynrunner.proto.assignment import Assignment, ClaimingRunner
from dynrunner.proto.masking import assignment_values

__all__ = [
    "RECORD_TTL",
    "FinalizeRecord",
    "FinalizeRecordStore",
    "FinalizeRecords",
    "open_record",
    "seal_record",
    "step_names",
]

log = logging.getLogger(__name__)

CONSUMED = b'{"consumed":true}'
"""What stays of a consumed record (no credential): its environment was reaped."""
RECORD_TTL = timedelta(days=8)
"""Longer than any job may run (`jobTimeoutMinutes` ≤ 7 days, plus grace): only records a
crash left behind ever expire."""
_STEP_NAME_MAX = 255
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class FinalizeRecord:
    assignment_id: str
    pool: str
    task_id: int
    runner: ClaimingRunner = field(repr=False)
    masks: tuple[str, ...] = field(default=(), repr=False)
    """Every credential the assignment carries (`masking.assignment_values`)."""
    steps: tuple[str, ...] = ()
    """The job's steps by index, named as Gitea names them at claim."""
    cache_token: str = field(default="", repr=False)
    """The runtime token the job registers with the actions cache ("" without a cache): the
    controller revokes that registration when it finalizes the job in its executor's place."""

    @classmethod
    def of(cls, assignment: Assignment) -> FinalizeRecord:
        return cls(
            assignment_id=assignment.assignment_id,
            pool=assignment.pool,
            task_id=assignment.task.id,
            runner=assignment.runner,
            masks=tuple(assignment_values(assignment)),
            steps=tuple(step_names(assignment.task.workflow_payload)),
            cache_token=runtime_token(assignment.task) if assignment.executor.cache.grant else "",
        )

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "assignment_id": self.assignment_id,
                "pool": self.pool,
                "task_id": self.task_id,
                "runner": {
                    "id": self.runner.id,
                    "uuid": self.runner.uuid,
                    "token": self.runner.token,
                    "name": self.runner.name,
                },
                "masks": list(self.masks),
                "steps": list(self.steps),
                "cache_token": self.cache_token,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> FinalizeRecord:
        raw = json.loads(data)
        runner = raw["runner"]
        return cls(
            assignment_id=str(raw["assignment_id"]),
            pool=str(raw["pool"]),
            task_id=int(raw["task_id"]),
            runner=ClaimingRunner(
                id=int(runner["id"]), uuid=str(runner["uuid"]), token=str(runner["token"]), name=str(runner["name"])
            ),
            masks=tuple(str(v) for v in raw["masks"]),
            steps=tuple(str(v) for v in raw["steps"]),
            cache_token=str(raw.get("cache_token", "")),
        )


def step_names(payload: bytes | None) -> list[str]:
    """The steps of the single job in a task's workflow payload, named as Gitea names its
    task steps at claim: the step's `name`, else its `uses`, else its `run`, else its `id`
    (act's `Step.String()`), cut to 255 characters. [] when the payload has no readable
    steps (a malformed payload is the executor's to report)."""
    if not payload:
        return []
    try:
        doc = yaml.load(payload, Loader=_Loader)
    except yaml.YAMLError:
        return []
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    job = next(iter(jobs.values())) if isinstance(jobs, dict) and len(jobs) == 1 else None
    steps = job.get("steps") if isinstance(job, dict) else None
    if not isinstance(steps, list):
        return []
    return [_step_name(step) for step in steps]


def _step_name(step: object) -> str:
    if not isinstance(step, dict):
        return ""
    for key in ("name", "uses", "run", "id"):
        value = step.get(key)
        text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
        if isinstance(text, str) and text:
            return text if len(text) <= _STEP_NAME_MAX else text[: _STEP_NAME_MAX - 1] + "…"
    return ""


class FinalizeRecords(Protocol):
    """The seam the launcher and the reaper use; `FinalizeRecordStore` is the implementation."""

    async def put(self, record: FinalizeRecord) -> None:
        """Store it (again: the same record for the same assignment is harmless)."""
        ...

    async def get(self, assignment_id: str) -> FinalizeRecord | None:
        """The record, None when there is none (never written, deleted, expired).
        SealingError when it cannot be opened (another key, altered, moved)."""
        ...

    async def delete(self, assignment_id: str) -> None:
        """Consume it: the record goes, a mark without any credential stays (until the
        bucket's TTL), so a replica that sees the environment gone knows it was reaped.
        Deleting what is not there is success."""
        ...

    async def consumed(self, assignment_id: str) -> bool:
        """Whether the record was consumed (`delete`)."""
        ...


def _aad(assignment_id: str) -> str:
    return f"finalize-record/{assignment_id}"


class FinalizeRecordStore:
    """`FinalizeRecords` in a JetStream KV bucket (file storage, one revision per key,
    entries expire after `RECORD_TTL`), each value sealed whole."""

    def __init__(self, kv: KeyValue, sealer: Sealer, bucket: str) -> None:
        self._kv = kv
        self._sealer = sealer
        self.bucket = bucket

    @classmethod
    async def open(cls, js: JetStreamContext, sealer: Sealer, bucket: str, *, replicas: int = 1) -> FinalizeRecordStore:
        kv = await open_bucket(
            js,
            KeyValueConfig(
                bucket=bucket,
                description="dynrunner: what finalizing each running task needs (sealed)",
                history=1,
                ttl=RECORD_TTL.total_seconds(),
                storage=StorageType.FILE,
                replicas=replicas,
            ),
        )
        return cls(kv, sealer, bucket)

    async def put(self, record: FinalizeRecord) -> None:
        await self._kv.put(record.assignment_id, seal_record(self._sealer, record))

    async def get(self, assignment_id: str) -> FinalizeRecord | None:
        entry = await stored(self._kv, assignment_id)
        if entry is None or entry[0] == CONSUMED:
            return None
        return open_record(self._sealer, assignment_id, entry[0])

    async def delete(self, assignment_id: str) -> None:
        # One revision per key: the mark replaces the record, nothing of it stays.
        await self._kv.put(assignment_id, CONSUMED)

    async def consumed(self, assignment_id: str) -> bool:
        entry = await stored(self._kv, assignment_id)
        return entry is not None and entry[0] == CONSUMED


def seal_record(sealer: Sealer, record: FinalizeRecord) -> bytes:
    """The stored form of `record`: sealed whole, bound to its assignment id."""
    return dump_sealed(sealer.seal(_aad(record.assignment_id), record.to_json()))


def open_record(sealer: Sealer, assignment_id: str, data: bytes) -> FinalizeRecord:
    """The record stored under `assignment_id`; SealingError if it is not one that opens there."""
    sealed = load_sealed(data, f"the finalize record of {assignment_id}")
    record = FinalizeRecord.from_json(sealer.unseal(_aad(assignment_id), sealed))
    if record.assignment_id != assignment_id:
        raise SealingError(f"the finalize record under {assignment_id} is {record.assignment_id}'s")
    return record
