"""JavaScript actions fetched from the Gitea double's git server: `pre`, `main`, `post`, state,
outputs, failure and cancellation; where their rows go in Gitea's log."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.gitea.views import TaskView
from dynrunner.proto.gitea import Result
from tests.fixtures.action_bundles import CHECKOUT
from tests.fixtures.clients import ActionClients
from tests.fixtures.executor import ExecutorHarness, rows_of

JS_ACTION = {
    "js/action.yml": """
name: greeter
inputs:
  who:
    required: true
  fail:
    default: 'false'
  token:
    default: ${{ github.token }}
outputs:
  greeting:
    description: what it said
runs:
  using: node20
  pre: pre.js
  main: main.js
  post: post.js
""",
    "js/pre.js": """
const fs = require('fs');
console.log(`pre: who=${process.env.INPUT_WHO}`);
fs.appendFileSync(process.env.GITHUB_STATE, `phase=pre\\nwho=${process.env.INPUT_WHO}\\n`);
""",
    "js/main.js": """
const fs = require('fs');
const path = require('path');
const env = process.env;
console.log(`main: who=${env.INPUT_WHO} state=${env.STATE_phase} action=${path.basename(env.GITHUB_ACTION_PATH)} ` +
  `repo=${env.GITHUB_ACTION_REPOSITORY} ref=${env.GITHUB_ACTION_REF} cwd=${process.cwd() === env.GITHUB_WORKSPACE}`);
console.log(`token given: ${env.INPUT_TOKEN.length > 0}, shown as ${env.INPUT_TOKEN}`);
fs.appendFileSync(env.GITHUB_OUTPUT, `greeting=hello ${env.INPUT_WHO}\\n`);
fs.appendFileSync(env.GITHUB_STATE, `phase=main\\n`);
if (env.INPUT_FAIL === 'true') {
  console.log('::error::failing on purpose');
  process.exit(1);
}
""",
    "js/post.js": """
console.log(`post: who=${process.env.STATE_who} phase=${process.env.STATE_phase}`);
""",
}


def setup_rows(task: TaskView) -> list[str]:
    return task.log_rows[: task.steps[0].log_index]


def complete_rows(task: TaskView) -> list[str]:
    last = task.steps[-1]
    return task.log_rows[last.log_index + last.log_length :]


def publish(gitea: GiteaDouble, repository: str, files: dict[str, str], *, private: bool = False) -> str:
    gitea.create_repository(repository, private=private)
    return gitea.commit(repository, files, tags=["v1"]).sha


NODE = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: js
        uses: acme/actions/js@v1
        with:
          who: world
      - run: echo "said ${{ steps.js.outputs.greeting }}"
      - id: bad
        name: failing greeter
        uses: acme/actions/js@v1
        with:
          who: nobody
          fail: 'true'
      - run: echo "skipped after the failure"
      - if: always()
        run: echo "always after the failure"
"""


async def test_a_node_action_with_pre_and_post_stages_and_a_failure(self_hosted_actions: ExecutorHarness) -> None:
    gitea = self_hosted_actions.gitea
    sha = publish(gitea, "acme/actions", JS_ACTION)
    claimed = await self_hosted_actions.claim(NODE)
    assert await self_hosted_actions.run(claimed) == 0
    task = gitea.task(claimed.task_id)
    token = str((claimed.task.context or {})["token"])
    assert task.result == Result.FAILURE
    assert [s.status for s in task.steps] == ["success", "success", "failure", "skipped", "success"]

    setup = setup_rows(task)
    assert setup.count(f"Download action repository 'acme/actions/js@v1' (SHA:{sha})") == 1  # fetched once
    assert "Prepare all required actions" in setup
    assert [row for row in setup if row.startswith("pre: ")] == ["pre: who=world", "pre: who=nobody"]
    assert "##[group]Pre failing greeter" in setup

    main = [row for row in rows_of(task, 0) if row.startswith(("main: ", "token "))]
    assert main == [
        "main: who=world state=pre action=js repo=acme/actions ref=v1 cwd=true",
        "token given: true, shown as ***",
    ]
    assert token not in "\n".join(task.log_rows)
    assert rows_of(task, 1)[-1] == "said hello world"
    assert "##[error]failing on purpose" in rows_of(task, 2)
    assert "##[error]Process completed with exit code 1." in rows_of(task, 2)

    complete = complete_rows(task)
    assert [row for row in complete if row.startswith("post: ")] == [
        "post: who=nobody phase=main",  # the latest registered first
        "post: who=world phase=main",
    ]
    groups = [row for row in complete if row.startswith("##[group]")]
    assert groups == ["##[group]Post failing greeter", "##[group]Post Run acme/actions/js@v1"]


CANCELLED = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - uses: acme/slow@v1
      - run: echo "not after the cancel"
"""

SLOW_ACTION = {
    "action.yml": "runs:\n  using: node20\n  main: main.js\n  post: post.js\n  post-if: cancelled()\n",
    "main.js": "console.log('main started'); setTimeout(() => {}, 600000);\n",
    "post.js": "console.log(`post after the cancel: ${process.env.GITHUB_ACTION_REPOSITORY}`);\n",
}


async def test_post_stages_run_after_a_cancellation(self_hosted_actions: ExecutorHarness) -> None:
    harness, gitea = self_hosted_actions, self_hosted_actions.gitea
    publish(gitea, "acme/slow", SLOW_ACTION)
    claimed = await harness.claim(CANCELLED)
    running = asyncio.create_task(harness.run(claimed))
    await harness.wait_for_log(claimed.task_id, "main started")
    gitea.cancel_run(claimed.run.id)
    assert await asyncio.wait_for(running, 30) == 0
    task = gitea.task(claimed.task_id)
    assert task.result == Result.CANCELLED
    assert [s.status for s in task.steps] == ["cancelled", "skipped"]
    assert "post after the cancel: acme/slow" in complete_rows(task)


PRIVATE = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: own
        uses: ${{ github.repository }}/js@v1
        with:
          who: own repository
      - uses: ${{ github.server_url }}/acme/shared/js@v1
        with:
          who: full URL
"""


async def test_actions_of_private_repositories_are_fetched_with_the_task_token(
    self_hosted_actions: ExecutorHarness,
) -> None:
    """The run's own private repository is readable with the task token only; the action is
    named through `uses: ${{ }}` (Gitea's extension) and through a full URL to Gitea itself.
    Such an action is fetched when its step runs, and its `pre` stage runs just before `main`."""
    gitea = self_hosted_actions.gitea
    publish(gitea, "owner/repo", JS_ACTION, private=True)
    publish(gitea, "acme/shared", JS_ACTION)
    task = await self_hosted_actions.run_job(PRIVATE, repository="owner/repo")
    assert task.result == Result.SUCCESS, task.log_rows
    assert [row for row in rows_of(task, 0) if row.startswith("main: ")] == [
        "main: who=own repository state=pre action=js repo=owner/repo ref=v1 cwd=true"
    ]
    assert [row for row in rows_of(task, 1) if row.startswith("main: ")] == [
        "main: who=full URL state=pre action=js repo=acme/shared ref=v1 cwd=true"
    ]
    download = [row for row in rows_of(task, 0) if row.startswith("Download action repository")]
    assert download and re.fullmatch(r"Download action repository 'owner/repo/js@v1' \(SHA:[0-9a-f]{40}\)", download[0])


async def test_an_action_that_cannot_be_fetched_fails_the_job_at_setup(self_hosted_actions: ExecutorHarness) -> None:
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - run: echo "never"
      - uses: acme/missing@v9
"""
    task = await self_hosted_actions.run_job(workflow)
    gitea = self_hosted_actions.gitea
    assert task.result == Result.FAILURE
    errors = [row for row in task.log_rows if row.startswith("##[error]")]
    assert len(errors) == 1
    assert errors[0].startswith(
        f"##[error]Failed to fetch the action 'acme/missing@v9' from {gitea.url}/acme/missing: "
    )
    assert "never" not in task.log_rows


@pytest.mark.parametrize("ref_kind", ["branch", "sha"])
async def test_a_branch_or_a_full_sha_names_the_version(self_hosted_actions: ExecutorHarness, ref_kind: str) -> None:
    gitea = self_hosted_actions.gitea
    gitea.create_repository("acme/refs")
    first = gitea.commit("acme/refs", {"action.yml": _echo_action("first")}).sha
    gitea.commit("acme/refs", {"action.yml": _echo_action("second")}, branch="next")
    ref = "next" if ref_kind == "branch" else first
    task = await self_hosted_actions.run_job(
        f"on: push\njobs:\n  b:\n    runs-on: self-hosted\n    steps:\n      - uses: acme/refs@{ref}\n"
    )
    assert task.result == Result.SUCCESS, task.log_rows
    assert rows_of(task, 0)[-1] == ("second" if ref_kind == "branch" else "first")


def _echo_action(text: str) -> str:
    return f"runs:\n  using: composite\n  steps:\n    - shell: sh\n      run: echo {text}\n"


async def test_a_checkout_style_action_reads_the_private_repository_with_the_task_token(
    self_hosted_actions: ExecutorHarness,
) -> None:
    """As `actions/checkout` does: git with an `http.extraheader` carrying the task token (its
    `token` input's default, `${{ github.token }}`), against Gitea's git server; the job then
    uses a local action from the repository it checked out."""
    gitea = self_hosted_actions.gitea
    publish(gitea, "acme/checkout", CHECKOUT)
    gitea.create_repository("owner/app", private=True)
    gitea.commit(
        "owner/app",
        {"README": "private content\n", "ci/hello/action.yml": _echo_action("local action from the checkout")},
    )
    workflow = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - uses: acme/checkout@v1
      - run: cat README
      - uses: ./ci/hello
"""
    task = await self_hosted_actions.run_job(workflow, repository="owner/app")
    assert task.result == Result.SUCCESS, task.log_rows
    assert rows_of(task, 0)[-1].startswith("checked out owner/app@")
    assert rows_of(task, 1)[-1] == "private content"
    assert rows_of(task, 2)[-1] == "local action from the checkout"


CORE_ACTION = """
inputs:
  Who Is:
    required: true
  fail:
    default: 'false'
outputs:
  greeting:
    description: said through core.setOutput
runs:
  using: node20
  main: main.js
  post: post.js
"""

CORE_MAIN = """
const core = require(require.resolve('@actions/core', {paths: [CLIENTS]}));
const who = core.getInput('who is', {required: true});
core.setSecret(`hidden-${who}`);
console.log(`the secret is hidden-${who}`);
core.setOutput('greeting', `hello\\n${who}`);
core.saveState('seen', `${who}\\nsecond line`);
core.exportVariable('FROM_CORE', 'exported by core');
core.addPath('/opt/from-core/bin');
core.warning('a warning from core');
core.startGroup('a group from core');
core.info('inside the group');
core.endGroup();
if (core.getBooleanInput('fail')) core.setFailed('failing through core.setFailed');
"""

CORE_POST = """
const core = require(require.resolve('@actions/core', {paths: [CLIENTS]}));
console.log(`post sees state: ${JSON.stringify(core.getState('seen'))}`);
"""

CORE_WORKFLOW = """
on: push
jobs:
  build:
    runs-on: self-hosted
    steps:
      - id: core
        uses: ./core
        with:
          who is: world
      - run: |
          echo "output: ${{ steps.core.outputs.greeting }}"
          echo "env: $FROM_CORE"
          case ":$PATH:" in *:/opt/from-core/bin:*) echo "path: added";; esac
      - uses: ./core
        with:
          who is: again
          fail: true
"""


async def test_the_real_actions_core_talks_to_the_executor(
    executor_harness: ExecutorHarness, action_clients: ActionClients
) -> None:
    """A Node action built on the real `@actions/core`: its file commands (multi-line values in
    GITHUB_OUTPUT, GITHUB_STATE and GITHUB_ENV with core's generated delimiters, GITHUB_PATH),
    getInput's name mangling and `required`, setSecret, warning, groups and setFailed reach
    the executor as GitHub's runner reads them."""
    head = f"const CLIENTS = {json.dumps(str(action_clients.root))};\n"
    files = {"core/action.yml": CORE_ACTION, "core/main.js": head + CORE_MAIN, "core/post.js": head + CORE_POST}
    task = await executor_harness.run_job(CORE_WORKFLOW, files=files)
    assert task.result == Result.FAILURE
    assert [s.status for s in task.steps] == ["success", "success", "failure"]
    first = rows_of(task, 0)
    assert "the secret is ***" in first and not any("hidden-world" in row for row in task.log_rows)
    assert "##[warning]a warning from core" in first
    assert first[-3:] == ["::group::a group from core", "inside the group", "::endgroup::"]  # Gitea folds these
    second = rows_of(task, 1)
    assert "output: hello" in second and "world" in second and "env: exported by core" in second
    assert "path: added" in second
    assert "##[error]failing through core.setFailed" in rows_of(task, 2)
    assert 'post sees state: "world\\nsecond line"' in task.log_rows
    assert 'post sees state: "again\\nsecond line"' in task.log_rows
