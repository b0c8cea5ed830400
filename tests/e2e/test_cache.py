"""The actions cache through the whole product: the controller serves it (`cache` section) and
signs each claimed job's grant, the local backend runs the real executor, which registers the
job and points `@actions/cache` at the server. Saved in one run, restored in the next; a job
of another repository finds nothing."""

from __future__ import annotations

import json
from pathlib import Path

from dynrunner.controller.config import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from tests.e2e.harness import REAL_EXECUTOR, config_data, in_process, wait_run_done
from tests.fixtures.clients import ActionClients

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


def _config(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> ControllerConfig:
    data = config_data(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "state",
        nats_url=nats_url,
        executor_command=[REAL_EXECUTOR],
    )
    data["cache"] = {"url": "http://127.0.0.1", "listen": "127.0.0.1:0"}  # port 0: the URL is the bound address
    return ControllerConfig.model_validate(data)


async def test_a_cache_saved_by_one_run_is_restored_by_the_next_and_only_in_its_repository(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, action_clients: ActionClients
) -> None:
    async with in_process(_config(gitea, nats_url, tmp_path)) as controller:
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
