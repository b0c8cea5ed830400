"""Which assignments were launched: a record that keeps a replayed message from running a job again.

An authentic assignment can come back as a *new* stream message — replayed by someone who
copied it off NATS, or published twice more than the duplicate window apart — long after its
job ran and its environment was reaped; nothing about the message tells it from the first.
The record does: one entry per assignment id, naming the stream message that launched it.

* `launching` (stream sequence): a launcher took that message and is creating the
  environment. A redelivery of the *same* message (the launcher died mid-launch, or the ack
  was lost) resumes: the backend finds the environment by assignment id.
* `done`: the environment exists and the delivery was answered, or the task was finalized
  or cancelled before it started. A redelivery of the same message is only acknowledged.

Any other message with the same assignment id is a replay, refused whatever the state.
Entries live in a JetStream KV bucket for `RECORD_TTL`, longer than any job may run
(`pools[].jobTimeoutMinutes` ≤ 7 days, plus the deadline's grace); after that an authentic
message has long passed its deadline, which the launcher also refuses.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Protocol

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from dynrunner.controller.assignments.log import open_bucket

__all__ = ["RECORD_TTL", "LaunchRecord", "Launched", "LaunchedRecord", "Verdict"]

log = logging.getLogger(__name__)

RECORD_TTL = timedelta(days=8)

Verdict = Literal["launch", "resume", "answered", "replayed"]
"""`launch`: first delivery, recorded as launching. `resume`: a redelivery of the message being
launched. `answered`: a redelivery of the message already launched (acknowledge it).
`replayed`: another message of an assignment launched from a different one (refuse it)."""


@dataclass(frozen=True, slots=True)
class Launched:
    state: Literal["launching", "done"]
    stream_seq: int

    def to_json(self) -> bytes:
        return json.dumps({"state": self.state, "seq": self.stream_seq}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Launched:
        raw = json.loads(data)
        state = raw["state"]
        if state not in ("launching", "done"):
            raise ValueError(f"unknown state {state!r}")
        return cls(state=state, stream_seq=int(raw["seq"]))

    def verdict(self, stream_seq: int) -> Verdict:
        if stream_seq != self.stream_seq:
            return "replayed"
        return "resume" if self.state == "launching" else "answered"


class LaunchRecord(Protocol):
    """The seam the launcher uses; `LaunchedRecord` is the implementation."""

    async def begin(self, assignment_id: str, stream_seq: int) -> tuple[Verdict, Launched | None]:
        """Record the message as launching unless the id is recorded already; the verdict, and
        the entry found (None when this call recorded it)."""
        ...

    async def done(self, assignment_id: str, stream_seq: int) -> None:
        """The launch of this message is over (environment created, or task finalized)."""
        ...


class LaunchedRecord:
    """`LaunchRecord` in a JetStream KV bucket (file storage, one revision per key, entries
    expire after `RECORD_TTL`)."""

    def __init__(self, kv: KeyValue, bucket: str) -> None:
        self._kv = kv
        self.bucket = bucket

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str, *, replicas: int = 1) -> LaunchedRecord:
        kv = await open_bucket(
            js,
            KeyValueConfig(
                bucket=bucket,
                description="dynrunner: assignments launched (replays of them are refused)",
                history=1,
                ttl=RECORD_TTL.total_seconds(),
                storage=StorageType.FILE,
                replicas=replicas,
            ),
        )
        return cls(kv, bucket)

    async def begin(self, assignment_id: str, stream_seq: int) -> tuple[Verdict, Launched | None]:
        mine = Launched("launching", stream_seq)
        try:
            await self._kv.create(assignment_id, mine.to_json())
        except nats.js.errors.KeyWrongLastSequenceError:
            pass  # recorded already (by an earlier delivery, or a create whose answer was lost)
        else:
            return "launch", None
        found = await self._get(assignment_id)
        if found is None:  # expired or purged between the two calls: record it now
            await self._kv.put(assignment_id, mine.to_json())
            return "launch", None
        return found.verdict(stream_seq), found

    async def done(self, assignment_id: str, stream_seq: int) -> None:
        await self._kv.put(assignment_id, Launched("done", stream_seq).to_json())

    async def state(self, assignment_id: str) -> Launched | None:
        """The entry of `assignment_id` (None: none, or expired)."""
        return await self._get(assignment_id)

    async def _get(self, assignment_id: str) -> Launched | None:
        try:
            entry = await self._kv.get(assignment_id)
        except nats.js.errors.KeyNotFoundError:  # also KeyDeletedError
            return None
        if entry.value is None:
            return None
        try:
            return Launched.from_json(entry.value)
        except (ValueError, KeyError, TypeError) as err:
            # Not ours: treat as launched from an unknown message, so nothing runs on its strength.
            log.error("launch record of %s is unreadable (%s); treating the assignment as launched", assignment_id, err)
            return Launched("done", -1)
