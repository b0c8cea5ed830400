"""List-then-watch of one collection, kept as a cache (what client-go's informer does).

List once, then watch from the list's resourceVersion with bookmarks, so a reconnect
resumes where it left off without a list; the server ends each watch after
`timeoutSeconds` and the next one starts from the last version seen (an object's or a
BOOKMARK's). 410 Gone (the version was compacted away) means list again: objects missing
from the new list are reported deleted, changed ones modified. Any other error reconnects
after a backoff. Nothing is polled: between changes the informer costs one idle connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from dynrunner.controller.backends.kubernetes.api import Gone
from dynrunner.controller.infra.loops import Backoff

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
"""How long the server keeps one watch open (kube-apiserver picks 30-60 min by itself; a
shorter one bounds how long a half-open connection goes unnoticed)."""
SHORT_WATCH_S = 1.0

Lister = Callable[[], Awaitable[dict[str, Any]]]
Watcher = Callable[[str, int], AsyncIterator[dict[str, Any]]]
Handler = Callable[[str, dict[str, Any]], None]
"""Called with ADDED, MODIFIED or DELETED and the object (for DELETED its last state)."""


def key_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name", ""))


class Informer:
    def __init__(
        self,
        name: str,
        lister: Lister,
        watcher: Watcher,
        handler: Handler,
        *,
        cache: bool = True,
        on_list: Callable[[], None] | None = None,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        timeout_s: int = WATCH_TIMEOUT_S,
        backoff: Backoff | None = None,
    ) -> None:
        self.name = name
        self._list = lister
        self._watch = watcher
        self._handler = handler
        self._keep = cache
        self._on_list = on_list
        self._transform = transform or (lambda obj: obj)
        """What is kept of each object (and handed on): client-go's transform function."""
        self._timeout_s = timeout_s
        self._backoff = backoff or Backoff(0.5, 30.0)
        self.cache: dict[str, dict[str, Any]] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        """Set after the first list: the cache holds every object from then on."""
        self.lists = 0
        self.watches = 0

    def remember(self, obj: dict[str, Any]) -> None:
        """An object this controller just created, before its watch event arrives (which then
        replaces it); one the watch has seen already is kept as it is."""
        if self._keep:
            self.cache.setdefault(key_of(obj), self._transform(obj))

    async def run(self) -> None:
        """List and watch until cancelled."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                started = time.monotonic()
                events = await self._watch_once()
                if events == 0 and time.monotonic() - started < SHORT_WATCH_S:
                    await asyncio.sleep(self._backoff.next())  # a server that closes at once: no hot loop
                else:
                    self._backoff.reset()
            except Gone:
                log.info("%s: resourceVersion %s is too old; listing again", self.name, self.resource_version)
                need_list = True
            except asyncio.CancelledError:
                raise
            except Exception as err:
                delay = self._backoff.next()
                log.warning("%s: %s; reconnecting in %.1fs", self.name, err, delay)
                await asyncio.sleep(delay)

    async def _relist(self) -> None:
        listed = await self._list()
        self.lists += 1
        self.resource_version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        items = {key_of(item): self._transform(item) for item in listed.get("items") or []}
        if self._keep:
            for key in [k for k in self.cache if k not in items]:
                self._handler("DELETED", self.cache.pop(key))
            for key, item in items.items():
                old = self.cache.get(key)
                self.cache[key] = item
                if old is None:
                    self._handler("ADDED", item)
                elif _version(old) != _version(item):
                    self._handler("MODIFIED", item)
        self.synced.set()
        if self._on_list is not None:
            self._on_list()

    async def _watch_once(self) -> int:
        self.watches += 1
        count = 0
        async for event in self._watch(self.resource_version, self._timeout_s):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                obj = self._transform(obj)
            version = _version(obj)
            if version:
                self.resource_version = version
            if kind == "BOOKMARK":
                continue
            count += 1
            key = key_of(obj)
            if kind == "DELETED":
                self.cache.pop(key, None)
            elif self._keep:
                self.cache[key] = obj
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._handler(str(kind), obj)
        return count


def _version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
