"""Leases in a JetStream key-value bucket whose entries expire: which replicas are alive, and
which one reaps a pool.

A holder writes its key and rewrites it every `RENEW_INTERVAL_S`, each time compare-and-set
on the revision it wrote last; NATS drops a key nobody rewrote for `LEASE_TTL_S` (the
bucket's max age, measured by the server's one clock). A holder acts on its lease only while
its last *confirmed* renewal was sent less than `FENCE_AFTER_S` ago (its own monotonic
clock): a renewal is stamped by the server after it was sent, so the holder stops acting at
least `LEASE_TTL_S - FENCE_AFTER_S` before anyone else can see the key gone and take over.

Two kinds of lease use the mechanism:

* a **replica lease** (`replicas.<name>`): every controller replica holds the one named
  after itself. A process restarted under the same name takes it over at once (the previous
  process is dead, or is told by its next renewal that its name is taken, and stops). While
  it is missing, other replicas may adopt that replica's armed runners.
* an **exclusive lease** (`reaper.<pool>`): at most one replica holds it; the others try
  again once it expired or was released.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from dynrunner.controller.assignments.log import open_bucket
from dynrunner.controller.infra.loops import Fatal, Stopping

__all__ = [
    "FENCE_AFTER_S",
    "LEASE_TTL_S",
    "RENEW_INTERVAL_S",
    "Lease",
    "ReplicaNameTaken",
    "exclusive",
    "open_lease_bucket",
    "replica_alive",
    "replica_incarnation",
    "replica_key",
    "wrong_last_sequence",
]

log = logging.getLogger(__name__)

LEASE_TTL_S = 10.0
RENEW_INTERVAL_S = 2.0
FENCE_AFTER_S = 6.0
_WRONG_LAST_SEQUENCE = (10071, 10164)  # JetStream's "wrong last sequence" error codes


def replica_key(name: str) -> str:
    return f"replicas.{name}"


def wrong_last_sequence(err: BaseException) -> bool:
    """A compare-and-set lost: the key is not at the revision the caller named."""
    if isinstance(err, nats.js.errors.KeyWrongLastSequenceError):
        return True
    return isinstance(err, nats.js.errors.APIError) and err.err_code in _WRONG_LAST_SEQUENCE


async def open_lease_bucket(
    js: JetStreamContext, bucket: str, *, replicas: int = 1, ttl_s: float = LEASE_TTL_S
) -> KeyValue:
    """The lease bucket (created if needed; its entries expire `ttl_s` after their last write)."""
    return await open_bucket(
        js,
        KeyValueConfig(
            bucket=bucket,
            description="dynrunner: controller replicas alive, and who reaps each pool (entries expire)",
            history=1,
            ttl=ttl_s,
            storage=StorageType.FILE,
            replicas=replicas,
        ),
    )


class ReplicaNameTaken(Fatal):
    """Another running controller took this replica's name (two replicas configured alike)."""


class Lease:
    """One key of the lease bucket, held by this process. `exclusive`: wait for a key another
    holder has (the reaper's); otherwise take it over (the replica's own name)."""

    def __init__(
        self,
        kv: KeyValue,
        key: str,
        holder: str,
        *,
        exclusive: bool,
        ttl_s: float = LEASE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`ttl_s` is the bucket's; renewals every fifth of it, fenced after six tenths."""
        self._kv = kv
        self.key = key
        self.holder = holder
        self.incarnation = secrets.token_hex(8)
        self._exclusive = exclusive
        self._clock = clock
        self.renew_interval_s = ttl_s * RENEW_INTERVAL_S / LEASE_TTL_S
        self._fence_after_s = ttl_s * FENCE_AFTER_S / LEASE_TTL_S
        self._value = json.dumps({"holder": holder, "incarnation": self.incarnation}).encode()
        self._revision: int | None = None
        self._confirmed: float | None = None
        self.term = 0
        """Counts the times the lease was (re)gained: whatever was decided under an earlier
        term is checked again before it is acted on."""
        self._changed = asyncio.Event()
        self._stopping = Stopping()

    @property
    def held(self) -> bool:
        """The last renewal was confirmed recently enough to act on the lease."""
        return self._confirmed is not None and self._clock() - self._confirmed < self._fence_after_s

    async def wait_held(self, until: Stopping | None = None) -> None:
        """Wait until the lease is held; raise `Stopped` once `until` (the waiting loop's stop
        flag) is set, which a lease that has stopped renewing would otherwise never end."""
        flag = Stopping() if until is None else until
        while not self.held:
            self._changed.clear()
            await flag.wait_on(self._changed, self.renew_interval_s)

    async def run(self) -> None:
        """Renew until `stop()` or cancelled (a failed renewal is logged and tried again; the
        lease fences itself once renewals keep failing). `stop()` ends it even when a
        cancellation is lost: on Python 3.11 `asyncio.wait_for`, which nats-py's requests use,
        can swallow one that arrives as the answer does."""
        while not self._stopping.is_set():
            try:
                await self.renew()
            except Fatal:
                raise
            except Exception as err:
                log.warning("lease %s: renewal failed: %s", self.key, str(err) or type(err).__name__)
            await self._stopping.sleep(self.renew_interval_s)

    def stop(self) -> None:
        """End `run()` (after the renewal in flight)."""
        self._stopping.set()

    @property
    def stopping(self) -> Stopping:
        """Set by `stop()` (`supervise` restarts nothing once it is)."""
        return self._stopping

    async def renew(self) -> bool:
        """Take or renew the lease once; True when it is held."""
        sent = self._clock()
        if self._revision is None:
            revision = await self._take()
        else:
            try:
                revision = await self._kv.update(self.key, self._value, last=self._revision)
            except Exception as err:
                if not wrong_last_sequence(err):
                    raise
                revision = await self._lost_revision()
        if revision is None:
            self._confirmed = None
            return False
        if self._revision is None:
            self.term += 1
        self._revision = revision
        self._confirmed = sent
        self._changed.set()
        return True

    async def release(self) -> None:
        """Give the lease up now (a graceful stop): others need not wait for it to expire."""
        revision, self._revision, self._confirmed = self._revision, None, None
        if revision is None:
            return
        try:
            try:
                await self._kv.delete(self.key, last=revision)
            except Exception as err:
                if not wrong_last_sequence(err):
                    raise
                # A renewal cancelled in flight may have moved the key on, its answer lost:
                # still ours, it is released at the revision it has now.
                current = await self._entry_with_revision()
                if current is not None and current[0].get("incarnation") == self.incarnation:
                    await self._kv.delete(self.key, last=current[1])
        except Exception as err:
            if not wrong_last_sequence(err):
                log.warning("lease %s: could not be released (%s); it expires", self.key, err)

    async def _take(self) -> int | None:
        try:
            return await self._create()
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        if self._exclusive:
            return None  # held by another; tried again at the next renewal
        entry = await self._entry()
        revision = await self._kv.put(self.key, self._value)
        if entry is not None:
            log.info(
                "replica lease %s: taken over from an earlier process of the same name (incarnation %s)",
                self.key,
                entry.get("incarnation"),
            )
        return revision

    async def _create(self) -> int:
        """`kv.create`, once more when the key expired inside it: nats-py's create re-reads a
        key it found in place (a delete's tombstone can be re-created), and a key whose TTL
        ends between the two requests is then "not found" instead of free."""
        try:
            return await self._kv.create(self.key, self._value)
        except nats.js.errors.KeyNotFoundError:
            return await self._kv.create(self.key, self._value)

    async def _lost_revision(self) -> int | None:
        """The key is not at the revision written last: expired (this process could not renew
        for `LEASE_TTL_S`), written by another, or written by us with the answer lost."""
        current = await self._entry_with_revision()
        if current is not None and current[0].get("incarnation") == self.incarnation:
            return current[1]
        self._revision = None
        self._confirmed = None
        if current is None:
            log.warning("lease %s expired before it was renewed; taking it again", self.key)
            return await self._take()
        if not self._exclusive:
            raise ReplicaNameTaken(
                f"another controller runs as replica {self.holder!r} (it took over the lease {self.key}): "
                "give every replica its own name (DYNRUNNER_REPLICA, e.g. the Pod name from the Downward API)"
            )
        log.warning("lease %s was taken by %s", self.key, current[0].get("holder"))
        return None

    async def _entry(self) -> dict[str, str] | None:
        found = await self._entry_with_revision()
        return None if found is None else found[0]

    async def _entry_with_revision(self) -> tuple[dict[str, str], int] | None:
        try:
            entry = await self._kv.get(self.key)
        except nats.js.errors.KeyNotFoundError:  # also KeyDeletedError
            return None
        if entry.value is None:
            return None
        try:
            value = json.loads(entry.value)
        except ValueError:
            value = {}
        return (value if isinstance(value, dict) else {}), int(entry.revision or 0)


@contextlib.asynccontextmanager
async def exclusive(kv: KeyValue, key: str, holder: str) -> AsyncIterator[bool]:
    """Hold the exclusive lease `key` for the block, renewed meanwhile, released after. Yields
    False (and holds nothing) when another holder has it: the caller leaves the work to it."""
    lease = Lease(kv, key, holder, exclusive=True)
    if not await lease.renew():
        yield False
        return
    renewing = asyncio.create_task(lease.run(), name=f"lease-{key}")
    try:
        yield True
    finally:
        # Let go to the end even when a cancellation lands meanwhile (a stop cancels a start
        # follower that is already letting go): a lease left to expire refuses the next
        # controller's hand-over, and that start then waits for the reaper's next full sweep.
        letting_go = asyncio.ensure_future(_let_go(lease, renewing))
        try:
            await asyncio.shield(letting_go)
        except asyncio.CancelledError:
            await letting_go  # bounded: one renewal interval, one request
            raise


async def _let_go(lease: Lease, renewing: asyncio.Task[None]) -> None:
    """End the renewals (the one in flight lands first: releasing before it would leave the
    key at a newer revision than the release names), then release."""
    lease.stop()
    renewing.cancel()
    await asyncio.wait({renewing}, timeout=lease.renew_interval_s)  # never hangs on a lost cancel
    await lease.release()


async def replica_alive(kv: KeyValue, name: str) -> bool:
    """Replica `name` holds its lease (its key has not expired)."""
    return await replica_incarnation(kv, name) is not None


async def replica_incarnation(kv: KeyValue, name: str) -> str | None:
    """The process holding replica `name`'s lease (None: nobody, it expired)."""
    try:
        entry = await kv.get(replica_key(name))
    except nats.js.errors.KeyNotFoundError:
        return None
    if not entry.value:
        return None
    try:
        return str(json.loads(entry.value)["incarnation"])
    except (ValueError, KeyError, TypeError):
        return ""
