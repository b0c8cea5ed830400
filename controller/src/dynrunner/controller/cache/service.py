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
from dynrunner.controller.cache.index import Conflict, Entry, Index, Revoked, TooManyPending
from dynrunner.controller.cache.staging import NoRoom, StagingLedger
from dynrunner.controller.cache.storage import CacheStorage, UploadError
from dynrunner.proto.artifacts.errors import ArtifactError
from dynrunner.proto.artifacts.store import Readable

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 512
MAX_KEYS = 10
DOWNLOAD_URL_TTL_S = 600
UPLOAD_URL_TTL_S = 3600
MAX_PENDING_PER_JOB = 32
"""Reservations one job may hold open at once (a job saves its caches one by one; each
reservation is an index row until it is committed, revoked or 6 hours old)."""


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
    max_entries: int = 10_000  # per repository, whatever their size


def _text(value: str, what: str) -> str:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise Refused(400, f"{what} is not valid text (an unpaired surrogate)") from None
    return value


def check_key(key: str) -> str:
    """The toolkit's own rule (`checkKey`): at most 512 characters, no comma."""
    if not key or len(key) > MAX_KEY_LENGTH or "," in key:
        raise Refused(400, f"Key Validation Error: {key[:80]!r} must be 1-512 characters without a comma")
    return _text(key, "the key")


def check_version(version: str) -> str:
    if not version or len(version) > MAX_KEY_LENGTH:
        raise Refused(400, "a cache version of 1-512 characters is required")
    return _text(version, "the version")


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
        self.staging = StagingLedger(limits.max_entry_bytes, limits.repo_bytes)
        self._recount_staging()

    def _recount_staging(self) -> None:
        """At start: the ledger counts what reservations staged before; staging no pending
        entry owns goes (an index lost or older than the staging must not hand it to a new
        entry)."""
        for entry_id in self.storage.staged_ids():
            entry = self.index.get(entry_id)
            if entry is None or entry.complete:
                self.storage.discard(entry_id)
                continue
            try:
                self.staging.take(entry_id, entry.repository, self.storage.staged_bytes(entry_id))
            except NoRoom:
                self.discard(entry)

    # -- jobs --------------------------------------------------------------------------------

    def register(self, grant_text: str, token: str) -> Grant:
        try:
            grant = grants.verify(grant_text, self._grant_key, token=token, now=self.clock())
        except grants.GrantError as err:
            raise Refused(403, f"cache registration refused: {err}") from None
        try:
            self.index.register(grant)
        except Revoked as err:
            raise Refused(403, f"cache registration refused: {err}") from None
        log.info("cache: registered a job of %s (task %s)", grant.repo, grant.task_id)
        return grant

    def revoke(self, token: str) -> None:
        """End the job's registration, and its uploads: nobody can commit them any more."""
        digest = grants.token_digest(token)
        if self.index.revoke(digest):
            for entry in self.index.pending_of(digest):
                self.discard(entry)

    def job(self, token: str) -> Grant:
        job = self.index.job(grants.token_digest(token)) if token else None
        if job is None:
            raise Refused(401, "this token belongs to no running job registered with the cache")
        return job

    # -- reading -------------------------------------------------------------------------------

    def lookup(self, job: Grant, keys: list[str], version: str) -> Entry | None:
        if not keys or len(keys) > MAX_KEYS:
            raise Refused(400, f"Key Validation Error: 1 to {MAX_KEYS} keys are allowed")
        return self.index.lookup(job, [check_key(k) for k in keys], check_version(version))

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
        check_version(version)
        if size is not None and size > self.limits.max_entry_bytes:
            raise Refused(
                400, f"Cache size of {size} B is over this cache's limit of {self.limits.max_entry_bytes} B, not saving"
            )
        try:
            return self.index.reserve(job, key, version, MAX_PENDING_PER_JOB)
        except Conflict as err:
            raise Refused(409, str(err)) from None
        except TooManyPending as err:
            raise Refused(429, str(err)) from None

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

    def take_room(self, entry: Entry, size: int) -> None:
        """Count `size` more staged bytes of `entry` before they are written (see staging.py):
        the entry's pieces stay within the entry limit and the uploads pending in its
        repository within the repository's limit, so no job fills the disk before it commits."""
        try:
            self.staging.take(entry.id, entry.repository, size)
        except NoRoom:
            limits = self.limits
            raise Refused(
                413,
                f"cache {entry.id} ({entry.key}): the upload would stage more than this cache allows "
                f"({limits.max_entry_bytes} B per entry, {limits.repo_bytes} B of uploads pending per repository)",
            ) from None

    def give_room(self, entry: Entry, size: int) -> None:
        self.staging.give_back(entry.id, size)

    def drop_piece(self, entry: Entry, piece: Path) -> None:
        """A piece sent again replaces the one staged before: that one goes, and its room."""
        if piece.is_file():
            size = piece.stat().st_size
            piece.unlink(missing_ok=True)
            self.give_room(entry, size)

    def commit(self, entry: Entry, size: int | None) -> Entry:
        """Publish the staged upload; then evict what no longer fits."""
        try:
            blob = self.storage.publish(entry.repo, entry.id, size)
        except UploadError as err:
            self.index.remove(entry.id)
            raise Refused(400, f"cache {entry.id} ({entry.key}): {err}") from None
        finally:
            self.staging.forget(entry.id)
        self.index.complete(entry.id, blob.location, blob.size)
        log.info("cache: saved %s %r (%d B)", entry.repo, entry.key, blob.size, extra={"scope": entry.scope})
        over = self.index.over_limit(entry.repository, self.limits.repo_bytes, entry.id, self.limits.max_entries)
        self._evict(over, "repository limit")
        if self.limits.total_bytes:
            self._evict(self.index.over_limit(None, self.limits.total_bytes, keep=entry.id), "total limit")
        done = self.index.get(entry.id)
        assert done is not None
        return done

    def discard(self, entry: Entry) -> None:
        self.index.remove(entry.id)
        self.storage.discard(entry.id)
        self.staging.forget(entry.id)

    # -- limits --------------------------------------------------------------------------------

    def sweep(self) -> int:
        """Drop entries unused for the retention time, stale reservations, expired jobs and
        revocations, reservations of jobs no longer registered, and staging no entry owns;
        returns how many entries went. One repository at a time: requests go on in between."""
        now = self.clock()
        gone = 0
        for repo in self.index.repositories():
            stale = self.index.stale(repo, now - self.limits.retention_s, now - self.limits.pending_s)
            self._evict(stale, "retention")
            gone += len(stale)
        self.index.forget_expired()
        for abandoned in self.index.abandoned():
            self.discard(abandoned)
        staged = self.storage.staged_ids()
        for orphan in staged - self.index.existing(staged):
            self.storage.discard(orphan)
            self.staging.forget(orphan)
        for counted in self.staging.entry_ids():
            entry = self.index.get(counted)
            if entry is None or entry.complete:  # a piece that raced its entry's end
                self.staging.forget(counted)
        return gone

    def _evict(self, victims: list[Entry], why: str) -> None:
        for victim in victims:
            self.index.remove(victim.id)
            self.storage.discard(victim.id)
            self.staging.forget(victim.id)
            if victim.location and not self.index.referenced(victim.repo, victim.location):
                try:
                    self.storage.delete(victim.repo, victim.location)
                except ArtifactError as err:
                    log.warning(
                        "cache: evicted %s %r but could not delete its archive: %s", victim.repo, victim.key, err
                    )
            log.info("cache: evicted %s %r (%d B, %s)", victim.repo, victim.key, victim.size, why)

    # -- signed URLs ---------------------------------------------------------------------------

    def signature(self, purpose: str, entry_id: int, expires: int, by: str = "") -> str:
        """Over the index's epoch too: a URL serves nothing once the index it names is lost
        (a new one may give its entry id to another repository's entry)."""
        data = f"{purpose}:{self.index.epoch}:{entry_id}:{expires}:{by}"
        return hmac.new(self._url_key, data.encode(), hashlib.sha256).hexdigest()

    def signed_query(self, purpose: str, entry_id: int, ttl_s: int, by: str = "") -> str:
        """`by`: whom the URL was handed to (a job's short name), for its per-job limits."""
        expires = int(self.clock()) + ttl_s
        return f"exp={expires}&by={by}&sig={self.signature(purpose, entry_id, expires, by)}"

    def check_signature(self, purpose: str, entry_id: int, expires: str, sig: str, by: str = "") -> None:
        try:
            when = int(expires)
        except ValueError:
            raise Refused(401, "missing or malformed signature") from None
        if when < self.clock():
            raise Refused(401, "this signed URL has expired")
        if not sig.isascii() or not hmac.compare_digest(sig, self.signature(purpose, entry_id, when, by)):
            raise Refused(401, "bad signature")
