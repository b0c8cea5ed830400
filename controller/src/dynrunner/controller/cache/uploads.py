"""Receiving the pieces of uploads (v1 byte ranges, v2 blocks and whole blobs) onto the
server's disk, within the staging room the service grants (see staging.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

from dynrunner.controller.cache.index import Entry
from dynrunner.controller.cache.service import CacheService, Refused

READ_CHUNK = 1024 * 1024


class Pieces:
    def __init__(self, service: CacheService, stall_s: float) -> None:
        self.service = service
        self.stall_s = stall_s
        self._writing: dict[Path, int] = {}
        """Pieces being received, and their entries: one upload per piece at a time, and no
        commit of an entry while a piece of it is still arriving."""
        self._committing: set[int] = set()

    @contextlib.contextmanager
    def settled(self, entry: Entry) -> Iterator[None]:
        """While the entry is committed: no piece of it arriving, none starting."""
        if entry.id in self._writing.values() or entry.id in self._committing:
            raise Refused(409, f"cache {entry.id} ({entry.key}): a piece of it is still being uploaded")
        self._committing.add(entry.id)
        try:
            yield
        finally:
            self._committing.discard(entry.id)

    async def receive(self, request: web.Request, entry: Entry, target: Path, length: int | None = None) -> None:
        """Stream the request body into `target` (exactly `length` bytes when given). Its room
        is taken before a byte is written (`CacheService.take_room`): the whole declared length
        at once, else chunk by chunk. A piece sent again replaces the one before; a piece that
        fails goes, and its room with it."""
        if target in self._writing or entry.id in self._committing:
            raise Refused(409, f"cache {entry.id} ({entry.key}): this piece is being uploaded already, or committed")
        self._writing[target] = entry.id
        taken = 0
        try:
            await asyncio.to_thread(self.service.drop_piece, entry, target)
            declared = length if length is not None else request.content_length
            if declared is not None:
                await asyncio.to_thread(self.service.take_room, entry, declared)
                taken = declared
            written = 0
            handle = await asyncio.to_thread(open, target, "wb")
            try:
                while chunk := await self._read(request, entry):
                    if declared is None:
                        await asyncio.to_thread(self.service.take_room, entry, len(chunk))
                        taken += len(chunk)
                    elif written + len(chunk) > declared:
                        raise Refused(400, f"the piece has more bytes than the {declared} its request declared")
                    written += len(chunk)
                    await asyncio.to_thread(handle.write, chunk)
            finally:
                await asyncio.to_thread(handle.close)
            if declared is not None and written != declared:
                raise Refused(400, f"the piece has {written} bytes, but the request declared {declared}")
        except BaseException:
            await asyncio.to_thread(target.unlink, True)
            await asyncio.to_thread(self.service.give_room, entry, taken)
            raise
        finally:
            del self._writing[target]

    async def _read(self, request: web.Request, entry: Entry) -> bytes:
        try:
            async with asyncio.timeout(self.stall_s):
                return await request.content.read(READ_CHUNK)
        except TimeoutError:
            raise Refused(408, f"cache {entry.id}: the upload stalled") from None
