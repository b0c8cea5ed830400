"""A job whose grant the cache server refuses runs on without a cache, and says why."""

from __future__ import annotations

import dataclasses

from tests.fixtures.cache import CacheFixture
from tests.fixtures.executor import ExecutorHarness

PRINT_ENV = """
on: push
jobs:
  env:
    runs-on: self-hosted
    steps:
      - run: echo "cache=${ACTIONS_CACHE_URL:-none} results=$ACTIONS_RESULTS_URL"
"""


async def test_a_refused_grant_leaves_the_job_without_a_cache(
    executor_harness: ExecutorHarness, cache_server: CacheFixture
) -> None:
    claimed = await executor_harness.claim(PRINT_ENV)
    forged = dataclasses.replace(cache_server, grants=dataclasses.replace(cache_server.grants, key=b"x" * 32))
    claimed = forged.attach(claimed)
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.status == "success"
    warning = next(row for row in task.log_rows if row.startswith("##[warning]"))
    assert "runs without a cache" in warning and "not signed with this cache server's key" in warning
    assert f"cache=none results={executor_harness.gitea.url}" in task.log_rows
    assert cache_server.service.index.job("anything") is None
