"""Armed runner registrations, kept sealed in a JetStream key-value bucket.

Gitea never cleans up an ephemeral runner that claimed nothing, so a restarted controller
must reuse the registrations it armed before instead of registering others. The whole
record (including the runner token) is sealed; the associated data binds it to its pool, so
a value copied under another pool's key does not open.

Ephemeral runners are kept one key per runner (`<pool>.r<id>`), and the sealed record names
the replica that owns it. Every change of owner is a compare-and-set on the key's revision,
so two replicas never both take one runner (`take`). Shared mode keeps its one runner under
the pool's name, as do records written before replicas (`<pool>`, `<pool>.<slot>`), which any
replica may take.
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

from dynrunner.controller.assignments.log import AssignmentLog, bucket_keys, open_bucket, stored
from dynrunner.controller.coordination.leases import wrong_last_sequence
from dynrunner.controller.infra.sealing import Sealer, SealingError, dump_sealed, load_sealed

__all__ = ["DEFAULT_BUCKET", "ArmedRegistration", "RegistrationStore", "StoredRegistration", "runner_key"]

log = logging.getLogger(__name__)

DEFAULT_BUCKET = "DYNRUNNER_REGISTRATIONS"


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


@dataclass(frozen=True, slots=True)
class StoredRegistration:
    """A registration as stored: its key, its owner (a replica name; "" before replicas) and
    the revision a compare-and-set names."""

    key: str
    registration: ArmedRegistration
    owner: str
    revision: int


def runner_key(pool: str, registration_id: int) -> str:
    """The key of one ephemeral runner (a dot never occurs in a pool name, so pools never collide)."""
    return f"{pool}.r{registration_id}"


def _of_pool(key: str, pool: str) -> bool:
    return key == pool or key.startswith(pool + ".")


def _always() -> bool:
    return True


def _aad(pool: str) -> str:
    return f"armed-registration/{pool}"


class RegistrationStore:
    def __init__(
        self,
        kv: KeyValue,
        sealer: Sealer,
        bucket: str,
        connected: Callable[[], bool] = lambda: True,
        js: JetStreamContext | None = None,
    ) -> None:
        """With `js` the listing reads the bucket's stream (`bucket_keys`); without it (an
        in-memory bucket) it asks the bucket for its keys."""
        self._kv = kv
        self._js = js
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
                description="dynrunner: armed runner registrations (sealed)",
                history=1,
                storage=StorageType.FILE,
                replicas=replicas or 1,
            ),
        )
        return cls(kv, sealer, bucket, connected, js)

    async def get(self, key: str) -> ArmedRegistration | None:
        """The registration stored at `key`, None if there is none. SealingError if it cannot be
        opened (sealed with a key this controller no longer holds, or altered)."""
        stored = await self.entry(key)
        return stored.registration if stored is not None else None

    async def entry(self, key: str) -> StoredRegistration | None:
        """The registration at `key` with its owner and revision."""
        entry = await stored(self._kv, key)
        if entry is None:
            return None
        pool = key.split(".", 1)[0]
        sealed = load_sealed(entry[0], f"armed registration of pool {pool!r}")
        plain = self._sealer.unseal(_aad(pool), sealed)
        try:
            owner = json.loads(plain).get("owner", "")
        except (ValueError, AttributeError):
            owner = ""
        return StoredRegistration(key, ArmedRegistration.from_json(plain), str(owner or ""), entry[1])

    async def listing(self, pool: str) -> list[StoredRegistration]:
        """Every registration of the pool (one that cannot be opened is logged and left alone)."""
        try:
            keys = await bucket_keys(self._js, self.bucket) if self._js is not None else await self._kv.keys()
        except nats.js.errors.NoKeysError:
            return []
        found: list[StoredRegistration] = []
        for key in keys:
            if not _of_pool(key, pool):
                continue
            try:
                stored = await self.entry(key)
            except SealingError as err:
                log.error("armed registration %s cannot be opened (%s); left alone", key, err)
                continue
            if stored is not None:
                found.append(stored)
        return found

    async def add(self, pool: str, reg: ArmedRegistration, owner: str) -> StoredRegistration:
        """Store a newly registered runner under its own key, owned by `owner`. Storing it again
        (a create whose answer was lost) finds it stored."""
        key = runner_key(pool, reg.id)
        try:
            revision = await self._kv.create(key, self._envelope(pool, reg, owner))
        except nats.js.errors.KeyWrongLastSequenceError:
            stored = await self.entry(key)
            if stored is None or stored.registration.id != reg.id:
                raise
            return stored
        return StoredRegistration(key, reg, owner, revision)

    async def take(self, stored: StoredRegistration, owner: str) -> StoredRegistration | None:
        """Make `owner` the owner of `stored` if it is still at `stored.revision` (a
        compare-and-set: of several replicas taking one runner, one succeeds). None when the
        record changed meanwhile. A record kept under a key of before replicas moves to its
        runner's key (whoever creates that key first has it)."""
        pool = stored.key.split(".", 1)[0]
        reg = stored.registration
        value = self._envelope(pool, reg, owner)
        key = runner_key(pool, reg.id)
        try:
            if stored.key == key:
                revision = await self._kv.update(key, value, last=stored.revision)
            else:
                revision = await self._kv.create(key, value)
        except Exception as err:
            if wrong_last_sequence(err):
                return None
            raise
        if stored.key != key:
            await self.remove(stored)
        return StoredRegistration(key, reg, owner, revision)

    async def remove(self, stored: StoredRegistration) -> bool:
        """Delete `stored` if it is still at its revision; False when it changed meanwhile."""
        try:
            await self._kv.delete(stored.key, last=stored.revision)
        except Exception as err:
            if wrong_last_sequence(err):
                return False
            raise
        return True

    async def put(self, key: str, reg: ArmedRegistration) -> int:
        """Store `reg` at `key` (shared mode: the pool's name); returns the KV revision."""
        return await self._kv.put(key, self._envelope(key.split(".", 1)[0], reg, ""))

    def _envelope(self, pool: str, reg: ArmedRegistration, owner: str) -> bytes:
        record = json.loads(reg.to_json())
        if owner:
            record["owner"] = owner
        return dump_sealed(self._sealer.seal(_aad(pool), json.dumps(record, separators=(",", ":")).encode()))

    async def delete(self, key: str) -> None:
        """Forget the registration at `key` (it was used, or Gitea no longer knows it)."""
        await self._kv.purge(key)

    async def delete_if(self, key: str, registration_id: int) -> bool:
        """Forget the registration at `key` only while it is the one with `registration_id`:
        one stored in the meantime (read, then replaced before the delete) stays. True when
        that registration is no longer stored."""
        try:
            stored = await self.entry(key)
        except SealingError:
            return False
        if stored is None or stored.registration.id != registration_id:
            return True
        await self.remove(stored)
        return True
