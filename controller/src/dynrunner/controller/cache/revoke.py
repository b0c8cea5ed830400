"""Ending a job's use of the cache when the controller, not the executor, ends the job.

An executor revokes its registration as its job ends. One that never got there (killed, its
environment failed or deleted) leaves its runtime token registered until the grant's expiry,
the job's deadline, and every step of that job could read the token. So when the reaper
finalizes such a job it revokes the registration too: in the cache server it runs itself,
or at the standalone server's `/_dynrunner/revoke`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:  # the server's modules load only where the controller serves the cache
    from dynrunner.controller.cache.service import CacheService

REVOKE_TIMEOUT_S = 10.0


class CacheRevoker:
    """Revokes the cache registration of a job's runtime token (the one its finalize record keeps)."""

    def __init__(self, url: str, service: CacheService | None = None) -> None:
        self.url = url.rstrip("/")
        self.service = service

    async def __call__(self, token: str) -> None:
        if self.service is not None:
            await asyncio.to_thread(self.service.revoke, token)
            return
        timeout = aiohttp.ClientTimeout(total=REVOKE_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.post(f"{self.url}/_dynrunner/revoke", json={"token": token}) as response,
        ):
            if response.status >= 400:
                raise RuntimeError(f"the cache server at {self.url} answered {response.status} to the revocation")
