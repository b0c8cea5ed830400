"""The actions toolkit's GitHub-only gates are opened in the bundles of fetched JavaScript actions
(as Gitea's runner does), so stock upload-artifact v4 and cache v2 work against Gitea; a local
action, the user's own checkout, is never rewritten. The bundle here carries the real
`@actions/cache` configuration module (tests/clients) in an ncc-style module wrapper."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynrunner.proto.gitea import Result
from tests.fixtures.clients import ActionClients
from tests.fixtures.executor import ExecutorHarness, rows_of

WORKFLOW = """
on: push
jobs:
  build:
    runs-on: self-hosted
    env:
      ACTIONS_CACHE_SERVICE_V2: "true"
      ACTIONS_CACHE_URL: http://cache.invalid/
    steps:
      - uses: {uses}
"""


def bundled_action(clients: ActionClients) -> dict[str, str]:
    config = (clients.root / "node_modules/@actions/cache/lib/internal/config.js").read_text()
    bundle = (
        "const modules = { config: (module, exports, require) => {\n"
        + config
        + "\n} };\nconst cache = {}; modules.config({ exports: cache }, cache, require);\n"
        + "console.log(`ghes=${cache.isGhes()} version=${cache.getCacheServiceVersion()} "
        + "url=${cache.getCacheServiceURL()}`);\n"
    )
    return {"action.yml": "runs:\n  using: node20\n  main: dist/index.js\n", "dist/index.js": bundle}


async def test_a_fetched_action_has_the_gates_open(
    self_hosted_actions: ExecutorHarness, action_clients: ActionClients
) -> None:
    gitea = self_hosted_actions.gitea
    gitea.create_repository("acme/cacher")
    gitea.commit("acme/cacher", bundled_action(action_clients), tags=["v1"])
    task = await self_hosted_actions.run_job(WORKFLOW.format(uses="acme/cacher@v1"))
    assert task.result == Result.SUCCESS, task.log_rows
    assert rows_of(task, 0)[-1] == "ghes=false version=v2 url=http://cache.invalid/"


async def test_a_local_action_is_never_rewritten(
    executor_harness: ExecutorHarness, action_clients: ActionClients
) -> None:
    files = {f"cacher/{name}": text for name, text in bundled_action(action_clients).items()}
    task = await executor_harness.run_job(WORKFLOW.format(uses="./cacher"), files=files)
    assert task.result == Result.SUCCESS, task.log_rows
    assert rows_of(task, 0)[-1].startswith("ghes=true version=v1 url=http://cache.invalid/")


async def test_a_seeded_action_is_opened_in_a_copy(
    executor_harness: ExecutorHarness, action_clients: ActionClients, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded = tmp_path / "seeded" / "github.com" / "acme" / "cacher" / "v1"
    for name, text in bundled_action(action_clients).items():
        (seeded / name).parent.mkdir(parents=True, exist_ok=True)
        (seeded / name).write_text(text)
    original = (seeded / "dist" / "index.js").read_bytes()
    monkeypatch.setenv("DYNRUNNER_ACTIONS_CACHE", str(tmp_path / "seeded"))
    task = await executor_harness.run_job(WORKFLOW.format(uses="acme/cacher@v1"))
    assert task.result == Result.SUCCESS, task.log_rows
    assert rows_of(task, 0)[-1] == "ghes=false version=v2 url=http://cache.invalid/"
    assert (seeded / "dist" / "index.js").read_bytes() == original
