"""A job whose grant the cache server refuses runs on without a cache, and says why."""

from __future__ import annotations

import dataclasses

from tests.fixtures.cache import CacheFixture, lookup_status
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


LOOKUP = """
on: push
jobs:
  use:
    runs-on: self-hosted
    steps:
      - run: |
          python3 - <<'PY'
          import os, urllib.request
          url = os.environ["ACTIONS_CACHE_URL"] + "_apis/artifactcache/cache?keys=k&version=v"
          token = os.environ["ACTIONS_RUNTIME_TOKEN"]
          request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
          print("while the job runs:", urllib.request.urlopen(request).status)
          PY
"""


async def test_a_jobs_token_opens_the_cache_only_while_the_job_runs(
    executor_harness: ExecutorHarness, cache_server: CacheFixture
) -> None:
    """A runtime token kept by a step (printed, sent away) is worth nothing to the cache once
    its job has ended: the executor revokes it as the job ends."""
    claimed = cache_server.attach(await executor_harness.claim(LOOKUP))
    token = str(claimed.task.context_get("gitea_runtime_token"))
    assert await executor_harness.run(claimed) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.status == "success" and "while the job runs: 204" in task.log_rows
    assert await lookup_status(cache_server.url, token) == 401
