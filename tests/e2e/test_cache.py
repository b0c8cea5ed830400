"""The actions cache through the whole product: the controller serves it (`cache` section) and
signs each claimed job's grant, the local backend runs the real executor, which registers the
job and points `@actions/cache` at the server. Saved in one run, restored in the next; a job
of another repository finds nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from dynrunner.controller.backends.local.layout import Layout
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.cache import lookup_status
from tests.fixtures.clients import ActionClients
from tests.fixtures.harness import LOCAL_CACHE, in_process, real_executor_config, wait_for, wait_run_done

WORKFLOW = """
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    steps:
      - run: |
          node {clients}/cache.cjs restore deps-{run} deps- deps
          test -f deps/installed && echo "restored $(cat deps/installed)" || echo "cold"
          mkdir -p deps && echo "{run}" > deps/installed
          node {clients}/cache.cjs save deps-{run} deps
"""


async def test_a_cache_saved_by_one_run_is_restored_by_the_next_and_only_in_its_repository(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, action_clients: ActionClients
) -> None:
    async with in_process(real_executor_config(gitea, nats_url, tmp_path / "state", cache=LOCAL_CACHE)) as controller:
        logs = []
        for repository, run in (("acme/app", "first"), ("acme/app", "second"), ("evil/other", "third")):
            submitted = gitea.submit(repository, WORKFLOW.format(clients=action_clients.root, run=run))
            done = await wait_run_done(gitea, submitted.id)
            rows = gitea.task(done.jobs[0].task_id).log_rows
            assert done.status == "success", "\n".join(rows)
            logs.append(rows)
        assert controller.controller.cache_url.startswith("http://127.0.0.1:")
    assert "cold" in logs[0]
    assert "restored first" in logs[1]
    assert "cold" in logs[2]
    saved = [json.loads(r) for r in logs[1] if r.startswith('{"cacheId"')]
    assert saved and saved[0]["cacheId"] > 0


KEPT_TOKEN = """
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    steps:
      - run: |
          echo "$ACTIONS_RUNTIME_TOKEN" > {out}
          echo "working"
          sleep 60
"""


async def test_a_killed_executors_token_stops_opening_the_cache_when_its_job_is_finalized(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    """A step keeps its job's runtime token, then the executor dies (as by the OOM killer)
    before it could revoke its cache registration: the reaper that finalizes the job revokes
    it, so the kept token no longer opens the cache (before: until the job's deadline)."""
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state", cache=LOCAL_CACHE)
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    kept = tmp_path / "kept-token"
    async with in_process(cfg) as running:
        url = running.controller.cache_url
        run = gitea.submit("acme/app", KEPT_TOKEN.format(out=kept))
        job = await wait_for(lambda: (j := gitea.jobs(run.id)[0]).task_id and j, what="claim")
        await wait_for(lambda: "working" in gitea.task(job.task_id).log_rows, what="the step ran")
        token = kept.read_text().strip()
        assert await lookup_status(url, token) == 204  # registered while the job runs
        [env_dir] = list(root.iterdir())
        layout = Layout(env_dir)
        executor = layout.read_int(layout.executor_pid_file)
        assert executor is not None
        os.kill(executor, signal.SIGKILL)
        done = await wait_run_done(gitea, run.id)
        assert done.status == "failure"
        for _ in range(100):  # the revocation follows the finalize that failed the run
            if await lookup_status(url, token) == 401:
                break
            await asyncio.sleep(0.05)
        assert await lookup_status(url, token) == 401
