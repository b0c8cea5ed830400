"""The controller revokes the cache registration of a job it finalizes (its executor did not):
in the server it runs itself, or at a standalone server over HTTP."""

from __future__ import annotations

import time

import pytest

from dynrunner.controller.cache.grants import grant_for_task, sign
from dynrunner.controller.cache.revoke import CacheRevoker
from dynrunner.controller.cache.service import Refused
from tests.fixtures.cache import CacheFixture

TOKEN = "runtime-token-of-the-job"


def _register(cache: CacheFixture) -> None:
    context = {"repository": "o/r", "ref": "refs/heads/main"}
    grant = grant_for_task(context, runtime_token=TOKEN, task_id=1, expires=int(time.time()) + 600, results_url="")
    cache.service.register(sign(grant, cache.grants.key), TOKEN)
    assert cache.service.job(TOKEN).repo == "o/r"


@pytest.mark.parametrize("in_process", [True, False], ids=["served-here", "standalone"])
async def test_a_finalized_jobs_registration_is_revoked(cache_server: CacheFixture, in_process: bool) -> None:
    _register(cache_server)
    await CacheRevoker(cache_server.url, cache_server.service if in_process else None)(TOKEN)
    with pytest.raises(Refused):
        cache_server.service.job(TOKEN)


async def test_an_unreachable_server_is_an_error_for_the_caller_to_log() -> None:
    with pytest.raises(OSError):
        await CacheRevoker("http://127.0.0.1:9")(TOKEN)
