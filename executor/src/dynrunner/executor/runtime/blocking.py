"""Blocking file and network work off the event loop, stoppable when the job is cancelled."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_thread(fn: Callable[[threading.Event], T]) -> T:
    """Run `fn(stop)` in a worker thread. If the caller is cancelled, `stop` is set and the thread is
    awaited before the cancellation goes on, so no transfer outlives its step and temporary files are
    cleaned up by `fn` itself."""
    stop = threading.Event()
    task = asyncio.ensure_future(asyncio.to_thread(fn, stop))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # fn ended with the stop as an error: retrieved, the cancellation is what matters
        raise
