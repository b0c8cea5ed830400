"""Each pool's armed runner registration, kept sealed in a JetStream key-value bucket.

Gitea never cleans up an ephemeral runner that claimed nothing, so a restarted controller
must reuse the registration it armed before instead of registering another one. The whole
record (including the runner token) is sealed; the associated data binds it to its pool, so
a value copied under another pool's key does not open.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from dynrunner.controller.assignments import AssignmentLog, open_bucket, stored
from dynrunner.controller.sealing import Sealer, SealingError, dump_sealed, load_sealed

__all__ = ["DEFAULT_BUCKET", "ArmedRegistration", "RegistrationStore"]

log = logging.getLogger(__name__)

DEFAULT_BUCKET = "DYNRUNNER_REGISTRATIONS"
_WRONG_LAST_SEQUENCE = (10071, 10164)  # JetStream's "wrong last sequence" error codes


@dataclass(frozen=True, slots=True)
class ArmedRegistration:
    """A registered, not yet used runner (Register's answer plus when it was made)."""

    id: int
    uuid: str
    token: str = field(repr=False)
    name: str
    labels: tuple[str, ...]
    created_at: datetime

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "id": self.id,
                "uuid": self.uuid,
                "token": self.token,
                "name": self.name,
                "labels": list(self.labels),
                "created_at": self.created_at.isoformat(),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ArmedRegistration:
        raw = json.loads(data)
        return cls(
            id=int(raw["id"]),
            uuid=str(raw["uuid"]),
            token=str(raw["token"]),
            name=str(raw["name"]),
            labels=tuple(str(x) for x in raw["labels"]),
            created_at=datetime.fromisoformat(raw["created_at"]),
        )


def _always() -> bool:
    return True


def _aad(pool: str) -> str:
    return f"armed-registration/{pool}"


class RegistrationStore:
    def __init__(self, kv: KeyValue, sealer: Sealer, bucket: str, connected: Callable[[], bool] = lambda: True) -> None:
        self._kv = kv
        self._sealer = sealer
        self.bucket = bucket
        self._connected = _always if connected is None else connected

    @property
    def reachable(self) -> bool:
        """The store's NATS connection is up (a put now has a chance to succeed)."""
        return self._connected()

    @classmethod
    async def open(
        cls,
        js_or_log: JetStreamContext | AssignmentLog,
        sealer: Sealer,
        *,
        bucket: str | None = None,
        replicas: int | None = None,
    ) -> RegistrationStore:
        """Open the bucket, creating it (file storage, one revision per key) if needed. With an
        AssignmentLog, bucket name and replicas come from its NATS configuration."""
        connected: Callable[[], bool] = _always
        if isinstance(js_or_log, AssignmentLog):
            js = js_or_log.js
            bucket = bucket or js_or_log.cfg.registrations_bucket
            replicas = replicas or js_or_log.cfg.replicas
            nc = js_or_log.nc

            def connected() -> bool:
                return nc.is_connected
        else:
            js = js_or_log
        bucket = bucket or DEFAULT_BUCKET
        kv = await open_bucket(
            js,
            KeyValueConfig(
                bucket=bucket,
                description="dynrunner: each pool's armed runner registration (sealed)",
                history=1,
                storage=StorageType.FILE,
                replicas=replicas or 1,
            ),
        )
        return cls(kv, sealer, bucket, connected)

    async def get(self, pool: str) -> ArmedRegistration | None:
        """The pool's armed registration, None if there is none. SealingError if it cannot be
        opened (sealed with a key this controller no longer holds, or altered)."""
        stored = await self._entry(pool)
        return stored[0] if stored is not None else None

    async def _entry(self, pool: str) -> tuple[ArmedRegistration, int] | None:
        """The stored registration and its KV revision."""
        entry = await stored(self._kv, pool)
        if entry is None:
            return None
        sealed = load_sealed(entry[0], f"armed registration of pool {pool!r}")
        return ArmedRegistration.from_json(self._sealer.unseal(_aad(pool), sealed)), entry[1]

    async def put(self, pool: str, reg: ArmedRegistration) -> int:
        """Store `reg` as the pool's armed registration; returns the KV revision."""
        return await self._kv.put(pool, dump_sealed(self._sealer.seal(_aad(pool), reg.to_json())))

    async def delete(self, pool: str) -> None:
        """Forget the pool's armed registration (it was used, or Gitea no longer knows it)."""
        await self._kv.purge(pool)

    async def delete_if(self, pool: str, registration_id: int) -> bool:
        """Forget the pool's armed registration only while it is the one with `registration_id`:
        one stored in the meantime (read, then replaced before the delete) stays. True when
        that registration is no longer stored."""
        try:
            stored = await self._entry(pool)
        except SealingError:
            return False
        if stored is None:
            return True
        reg, revision = stored
        if reg.id != registration_id:
            return True
        try:
            await self._kv.delete(pool, last=revision)
        except nats.js.errors.APIError as err:
            if err.err_code in _WRONG_LAST_SEQUENCE:
                return True  # replaced by a newer registration meanwhile
            raise
        return True
