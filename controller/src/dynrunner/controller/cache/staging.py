"""The staging ledger: room on the server's disk taken before upload bytes are written.

Every byte of an upload is counted here before it reaches the disk, and the check and the
count are one step under one lock: requests in parallel (PATCHes at different offsets, Put
Blocks with new ids, uploads to many reservations) take room one after another, so their sum
stays within the entry limit and the repository's pending limit, whatever they declared when
they began. A piece with a known length (a v1 range, a Content-Length) takes all its room
before its body streams; one of unknown length, chunk by chunk.
"""

from __future__ import annotations

import collections
import threading

from dynrunner.controller.cache.index import RepoKey


class NoRoom(Exception):
    """Taking these bytes would stage more than the entry or its repository may."""


class StagingLedger:
    def __init__(self, max_entry_bytes: int, repo_bytes: int) -> None:
        self.max_entry_bytes = max_entry_bytes
        self.repo_bytes = repo_bytes
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[RepoKey, int]] = {}
        self._repos: collections.Counter[RepoKey] = collections.Counter()

    def take(self, entry_id: int, repo: RepoKey, size: int) -> None:
        with self._lock:
            _, held = self._entries.get(entry_id, (repo, 0))
            if held + size > self.max_entry_bytes or self._repos[repo] + size > self.repo_bytes:
                raise NoRoom(f"{size} B more would stage over the limits")
            self._entries[entry_id] = (repo, held + size)
            self._repos[repo] += size

    def give_back(self, entry_id: int, size: int) -> None:
        with self._lock:
            if entry_id not in self._entries or size <= 0:
                return
            repo, held = self._entries[entry_id]
            size = min(size, held)
            self._settle(entry_id, repo, held - size, size)

    def forget(self, entry_id: int) -> None:
        """The entry's staging is gone (committed, discarded, evicted)."""
        with self._lock:
            if entry_id in self._entries:
                repo, held = self._entries[entry_id]
                self._settle(entry_id, repo, 0, held)

    def _settle(self, entry_id: int, repo: RepoKey, left: int, freed: int) -> None:
        if left:
            self._entries[entry_id] = (repo, left)
        else:
            del self._entries[entry_id]
        self._repos[repo] -= freed
        if self._repos[repo] <= 0:
            del self._repos[repo]

    def entry_ids(self) -> set[int]:
        with self._lock:
            return set(self._entries)

    def held(self, entry_id: int) -> int:
        with self._lock:
            return self._entries.get(entry_id, ((0, ""), 0))[1]

    def repo_held(self, repo: RepoKey) -> int:
        with self._lock:
            return self._repos[repo]
