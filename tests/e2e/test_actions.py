"""`uses:` actions through the whole product: the controller claims from the Gitea double
(`DEFAULT_ACTIONS_URL = self`, so `owner/repo@ref` is fetched from it with the task token),
the local backend runs the real executor, actions are fetched with git from the double's git
server. A run of two jobs checks out the run's private repository with a checkout-style action,
uses a composite action from that checkout, restores and (in its post stage) saves a cache with
an actions/cache-style action, and uploads an artifact the second job downloads, with the real
`@actions/cache` and `@actions/artifact` (v4) clients. The next run restores the cache; a run of
another repository does not. Post stages run after a failing step and after a cancellation.

The JavaScript actions are built as ncc builds real ones: the toolkit's modules that hold its
GitHub-only gates (`isGhes`, the cache service URL) are inlined in the action's own bundle, and
the executor opens them there as Gitea's runner does; the rest of the toolkit comes from the
pinned clients (tests/clients)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.action_bundles import CHECKOUT, artifact_action, cache_action, greeting_action
from tests.fixtures.clients import ActionClients
from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.harness import LOCAL_CACHE, in_process, real_executor_config, wait_run_done

CLEANUP = {
    "action.yml": "runs:\n  using: node20\n  main: main.js\n  post: post.js\n",
    "main.js": "console.log('cleanup registered');\n",
    "post.js": "console.log('cleanup ran');\n",
}

APP = {
    "README": "the app\n",
    ".github/actions/greet/action.yml": greeting_action(
        'echo "text=hello ${{ inputs.who }} from $(cat README)" >> "$GITHUB_OUTPUT"'
    ),
}

PIPELINE = """
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    steps:
      - uses: acme/checkout@v1
      - id: greet
        uses: ./.github/actions/greet
        with:
          who: e2e
      - run: echo "${{ steps.greet.outputs.said }}"
      - uses: acme/cache@v1
        with:
          key: deps-${{ github.run_id }}
          restore-keys: deps-
          path: deps
      - run: |
          if [ -f deps/stamp ]; then echo "deps from run $(cat deps/stamp)"; else echo "no deps yet"; fi
          mkdir -p deps dist && echo "${{ github.run_id }}" > deps/stamp
          echo "built in run ${{ github.run_id }}" > dist/out.txt
      - uses: acme/artifacts@v1
        with:
          mode: upload
          name: dist
          path: dist/out.txt
  test:
    needs: build
    runs-on: [self-hosted, local]
    steps:
      - uses: acme/artifacts@v1
        with:
          mode: download
          name: dist
          path: got
      - run: cat got/out.txt
"""

POST_AFTER = """
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    steps:
      - uses: acme/cleanup@v1
      - run: {last}
"""


def rows(gitea: GiteaDouble, task_id: int) -> list[str]:
    return gitea.task(task_id).log_rows


def _publish(gitea: GiteaDouble, clients: ActionClients) -> None:
    for name, files in (
        ("acme/checkout", CHECKOUT),
        ("acme/artifacts", artifact_action(clients)),
        ("acme/cache", cache_action(clients)),
        ("acme/cleanup", CLEANUP),
    ):
        gitea.create_repository(name)
        gitea.commit(name, files, tags=["v1"])
    for name in ("owner/app", "evil/other"):
        gitea.create_repository(name, private=True)
        gitea.commit(name, APP)


async def test_checkout_composite_node_artifacts_and_cache_through_the_controller(
    gitea_factory: GiteaFactory, nats_url: str, tmp_path: Path, action_clients: ActionClients
) -> None:
    async with gitea_factory(default_actions_url="self") as gitea:
        _publish(gitea, action_clients)
        async with in_process(real_executor_config(gitea, nats_url, tmp_path / "state", cache=LOCAL_CACHE)):
            done = []
            for repository in ("owner/app", "owner/app", "evil/other"):
                run = await wait_run_done(gitea, gitea.submit(repository, PIPELINE).id, within=120)
                done.append(run)
                build, test = (rows(gitea, job.task_id) for job in run.jobs)
                assert run.status == "success", "\n".join(build + test)
                assert any(row.startswith(f"checked out {repository}@") for row in build), build
                assert "hello e2e from the app" in build
                assert "uploaded dist: " in "\n".join(build)
                assert f"built in run {run.id}" in test
            first, second, other = ([rows(gitea, job.task_id) for job in run.jobs] for run in done)
    assert "cache protocol v2" in first[0]  # the gate opened: v2, not GHES's v1
    assert "cache miss" in first[0] and "no deps yet" in first[0]
    assert f"cache saved as deps-{done[0].id}" in first[0]  # the post stage, under "Complete job"
    assert f"cache restored from deps-{done[0].id}" in second[0] and f"deps from run {done[0].id}" in second[0]
    assert "cache miss" in other[0] and "no deps yet" in other[0]  # another repository's job sees none


async def test_post_stages_run_after_a_failing_step_and_after_a_cancellation(
    gitea_factory: GiteaFactory, nats_url: str, tmp_path: Path, action_clients: ActionClients
) -> None:
    async with gitea_factory(default_actions_url="self") as gitea:
        _publish(gitea, action_clients)
        async with in_process(real_executor_config(gitea, nats_url, tmp_path / "state", cache=LOCAL_CACHE)):
            failed = await wait_run_done(gitea, gitea.submit("owner/app", POST_AFTER.format(last="exit 1")).id)
            cancelled = gitea.submit("owner/app", POST_AFTER.format(last='echo "sleeping"; sleep 600'))
            task_id = await _running_task(gitea, cancelled.id, "sleeping")
            gitea.cancel_run(cancelled.id)
            cancelled_done = await wait_run_done(gitea, cancelled.id)
            after_failure, after_cancel = rows(gitea, failed.jobs[0].task_id), rows(gitea, task_id)
    assert failed.status == "failure" and "cleanup ran" in after_failure
    assert cancelled_done.status == "cancelled" and "cleanup ran" in after_cancel


async def _running_task(gitea: GiteaDouble, run_id: int, row: str) -> int:
    """The task of the run's job once its log has `row`."""
    async with asyncio.timeout(60):
        while True:
            jobs = [job for job in gitea.run(run_id).jobs if job.task_id]
            if jobs and row in gitea.task(jobs[0].task_id).log_rows:
                return jobs[0].task_id
            await asyncio.sleep(0.1)
