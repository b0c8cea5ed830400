"""The cache's rules, apart from HTTP: who may use it, what a job sees and writes, the limits.

Blocking (SQLite, files, the store): the HTTP layer calls these methods in worker threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dynrunner.controller.cache import grants
from dynrunner.controller.cache.grants import Grant
from dynrunner.controller.cache.index import Conflict, Entry, Index
from dynrunner.controller.cache.storage import CacheStorage, UploadError
from dynrunner.proto.artifacts.errors import ArtifactError
from dynrunner.proto.artifacts.store import Readable

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 512
MAX_KEYS = 10
DOWNLOAD_URL_TTL_S = 600
UPLOAD_URL_TTL_S = 3600


class Refused(Exception):
    """A request the rules refuse; `status` is the HTTP answer, the message what the client shows."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Limits:
    max_entry_bytes: int
    repo_bytes: int
    total_bytes: int  # 0: no limit across repositories
    retention_s: float  # an entry nobody restored or wrote for this long goes
    pending_s: float  # a reservation not committed within this goes


def check_key(key: str) -> str:
    """The toolkit's own rule (`checkKey`): at most 512 characters, no comma."""
    if not key or len(key) > MAX_KEY_LENGTH or "," in key:
        raise Refused(400, f"Key Validation Error: {key[:80]!r} must be 1-512 characters without a comma")
    return key


class CacheService:
    def __init__(
        self,
        index: Index,
        storage: CacheStorage,
        *,
        grant_key: bytes,
        limits: Limits,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.index = index
        self.storage = storage
        self.limits = limits
        self.clock = clock
        self._grant_key = grant_key
        self._url_key = hmac.new(grant_key, b"dynrunner cache signed URLs", hashlib.sha256).digest()

    # -- jobs --------------------------------------------------------------------------------

    def register(self, grant_text: str, token: str) -> Grant:
        try:
            grant = grants.verify(grant_text, self._grant_key, token=token, now=self.clock())
        except grants.GrantError as err:
            raise Refused(403, f"cache registration refused: {err}") from None
        self.index.register(grant)
        log.info("cache: registered a job of %s (task %s)", grant.repo, grant.task_id)
        return grant

    def revoke(self, token: str) -> None:
        self.index.revoke(grants.token_digest(token))

    def job(self, token: str) -> Grant:
        job = self.index.job(grants.token_digest(token)) if token else None
        if job is None:
            raise Refused(401, "this token belongs to no running job registered with the cache")
        return job

    # -- reading -------------------------------------------------------------------------------

    def lookup(self, job: Grant, keys: list[str], version: str) -> Entry | None:
        if not keys or len(keys) > MAX_KEYS:
            raise Refused(400, f"Key Validation Error: 1 to {MAX_KEYS} keys are allowed")
        if not version:
            raise Refused(400, "a cache version is required")
        return self.index.lookup(job, [check_key(k) for k in keys], version)

    @contextlib.contextmanager
    def open(self, entry_id: int) -> Iterator[tuple[Entry, Readable]]:
        entry = self.index.get(entry_id)
        if entry is None or not entry.complete:
            raise Refused(404, f"cache entry {entry_id} does not exist")
        self.index.touch(entry_id)
        try:
            with self.storage.open(entry.repo, entry.location) as stream:
                yield entry, stream
        except ArtifactError as err:
            if "missing" in str(err):
                self.index.remove(entry_id)  # its blob is gone (an outside cleanup): forget it
                raise Refused(404, f"cache entry {entry_id} lost its archive") from None
            raise

    # -- writing -------------------------------------------------------------------------------

    def reserve(self, job: Grant, key: str, version: str, size: int | None = None) -> Entry:
        check_key(key)
        if not version:
            raise Refused(400, "a cache version is required")
        if size is not None and size > self.limits.max_entry_bytes:
            raise Refused(
                400, f"Cache size of {size} B is over this cache's limit of {self.limits.max_entry_bytes} B, not saving"
            )
        try:
            return self.index.reserve(job, key, version)
        except Conflict as err:
            raise Refused(409, str(err)) from None

    def writable(self, job: Grant, entry_id: int) -> Entry:
        """The job's own reservation `entry_id`, still open for upload."""
        entry = self.index.get(entry_id)
        if entry is None:
            raise Refused(400, f"cache {entry_id}: not reserved")
        if entry.writer != job.token_sha256:
            raise Refused(403, f"cache {entry_id}: reserved by another job")
        if entry.complete:
            raise Refused(400, f"cache {entry_id}: already complete")
        return entry

    def pending(self, job: Grant, key: str, version: str) -> Entry | None:
        return self.index.pending(job, key, version)

    def staging_room(self, entry: Entry, piece: Path) -> int:
        """Bytes one more piece of `entry`'s upload may stage (replacing `piece` if it is there):
        the entry's pieces stay within the entry limit and the uploads pending in its
        repository within the repository's limit, so no job fills the disk before it commits."""
        replaced = piece.stat().st_size if piece.is_file() else 0
        own = self.storage.staged_bytes(entry.id) - replaced
        repo = sum(self.storage.staged_bytes(other) for other in self.index.pending_ids(entry.repo)) - replaced
        return max(0, min(self.limits.max_entry_bytes - own, self.limits.repo_bytes - repo))

    def commit(self, entry: Entry, size: int | None) -> Entry:
        """Publish the staged upload; then evict what no longer fits."""
        try:
            blob = self.storage.publish(entry.repo, entry.id, size)
        except UploadError as err:
            self.index.remove(entry.id)
            raise Refused(400, f"cache {entry.id} ({entry.key}): {err}") from None
        self.index.complete(entry.id, blob.location, blob.size)
        log.info("cache: saved %s %r (%d B)", entry.repo, entry.key, blob.size, extra={"scope": entry.scope})
        self._evict(self.index.over_limit(entry.repo, self.limits.repo_bytes, keep=entry.id), "repository limit")
        if self.limits.total_bytes:
            self._evict(self.index.over_limit(None, self.limits.total_bytes, keep=entry.id), "total limit")
        done = self.index.get(entry.id)
        assert done is not None
        return done

    def discard(self, entry: Entry) -> None:
        self.index.remove(entry.id)
        self.storage.discard(entry.id)

    # -- limits --------------------------------------------------------------------------------

    def sweep(self) -> int:
        """Drop entries unused for the retention time, stale reservations, expired jobs and
        staging no entry owns; returns how many entries went."""
        now = self.clock()
        stale = self.index.stale(now - self.limits.retention_s, now - self.limits.pending_s)
        self._evict(stale, "retention")
        known = {e.id for e in self.index.entries()}
        for orphan in self.storage.staged_ids() - known:
            self.storage.discard(orphan)
        return len(stale)

    def _evict(self, victims: list[Entry], why: str) -> None:
        for victim in victims:
            self.index.remove(victim.id)
            self.storage.discard(victim.id)
            if victim.location and not self.index.referenced(victim.repo, victim.location):
                try:
                    self.storage.delete(victim.repo, victim.location)
                except ArtifactError as err:
                    log.warning(
                        "cache: evicted %s %r but could not delete its archive: %s", victim.repo, victim.key, err
                    )
            log.info("cache: evicted %s %r (%d B, %s)", victim.repo, victim.key, victim.size, why)

    # -- signed URLs ---------------------------------------------------------------------------

    def signature(self, purpose: str, entry_id: int, expires: int) -> str:
        return hmac.new(self._url_key, f"{purpose}:{entry_id}:{expires}".encode(), hashlib.sha256).hexdigest()

    def signed_query(self, purpose: str, entry_id: int, ttl_s: int) -> str:
        expires = int(self.clock()) + ttl_s
        return f"exp={expires}&sig={self.signature(purpose, entry_id, expires)}"

    def check_signature(self, purpose: str, entry_id: int, expires: str, sig: str) -> None:
        try:
            when = int(expires)
        except ValueError:
            raise Refused(401, "missing or malformed signature") from None
        if when < self.clock():
            raise Refused(401, "this signed URL has expired")
        if not hmac.compare_digest(sig, self.signature(purpose, entry_id, when)):
            raise Refused(401, "bad signature")
