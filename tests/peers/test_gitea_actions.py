"""`uses:` actions hosted in a real Gitea (1.24, 1.25, 1.26; `[actions] DEFAULT_ACTIONS_URL =
self`), and a private repository read with the task token over git's HTTP protocol.

An organisation holds three public action repositories, tagged `v1` through the REST API: a
checkout-style Node action (it fetches the workflow's repository with the task token as
actions/checkout does: `AUTHORIZATION: basic base64(x-access-token:<token>)`), a composite
action that itself uses a Node action of the same Gitea, and that Node action (pre, main,
post stages, an output). The workflow's repository is private: its one commit (the contents
API: a push) brings the workflow, a file and a local composite action, which the job can run
only once the checkout action cloned the repository; the task token reads that repository
over git's HTTP protocol, and not another private repository of the organisation (Gitea 1.26
admits one only when the owner's actions settings list it). Then the same workflow against
the Gitea double answering as that release, the actions published on its git server: both
servers' jobs must print the same rows.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.action_bundles import CHECKOUT, greeting_action
from tests.fixtures.peer_controller import describe, peer_controller, run_on_double, wait_runs
from tests.fixtures.real_gitea import RealGitea

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

HELLO = {
    "action.yml": """\
name: hello
inputs:
  who:
    default: nobody
outputs:
  said:
    description: the greeting
runs:
  using: node20
  pre: pre.js
  main: main.js
  post: post.js
""",
    "pre.js": "console.log('row hello pre ran');\n",
    "main.js": """\
const fs = require('fs');
const said = `hello ${process.env.INPUT_WHO} from node at ${process.env.GITHUB_ACTION_REPOSITORY}`;
fs.appendFileSync(process.env.GITHUB_OUTPUT, `said=${said}\\n`);
console.log(`row ${said}`);
""",
    "post.js": "console.log('row hello post ran');\n",
}


def greet(org: str) -> dict[str, str]:
    """A composite action that uses the Node action `hello` of the same Gitea."""
    return {
        "action.yml": f"""\
name: greet
inputs:
  who:
    required: true
outputs:
  said:
    value: ${{{{ steps.say.outputs.text }}}} / ${{{{ steps.node.outputs.said }}}}
runs:
  using: composite
  steps:
    - id: say
      shell: bash
      run: echo "text=hello ${{{{ inputs.who }}}} from the composite action" >> "$GITHUB_OUTPUT"
    - id: node
      uses: {org}/hello@v1
      with:
        who: ${{{{ inputs.who }}}}-nested
"""
    }


APP = {
    "APP.txt": "the private app\n",
    ".github/actions/local/action.yml": greeting_action(
        'echo "text=hello ${{ inputs.who }} from $(cat APP.txt)" >> "$GITHUB_OUTPUT"'
    ),
}


def workflow(org: str) -> str:
    return f"""\
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    steps:
      - uses: {org}/checkout@v1
      - run: echo "row checked out $(cat APP.txt)"
      - id: local
        uses: ./.github/actions/local
        with:
          who: local
      - id: remote
        uses: {org}/greet@v1
        with:
          who: remote
      - id: node
        uses: {org}/hello@v1
        with:
          who: direct
      - run: |
          echo "row local: ${{{{ steps.local.outputs.said }}}}"
          echo "row remote: ${{{{ steps.remote.outputs.said }}}}"
          echo "row node: ${{{{ steps.node.outputs.said }}}}"
      - name: git over HTTP with the task token
        env:
          TOKEN: ${{{{ github.token }}}}
        run: |
          url="${{{{ github.server_url }}}}/${{{{ github.repository }}}}"
          cd "$(mktemp -d)"  # outside the checkout, whose .git/config holds the token's header
          export GIT_TERMINAL_PROMPT=0
          git ls-remote "$url" refs/heads/main > /dev/null 2>&1 || echo "row anonymous read refused"
          basic=$(printf 'x-access-token:%s' "$TOKEN" | base64 -w0)
          git -c "http.extraheader=AUTHORIZATION: basic $basic" ls-remote "$url" refs/heads/main \\
            | grep -q "${{{{ github.sha }}}}" && echo "row the task token reads the private repository"
          git -c "http.extraheader=AUTHORIZATION: basic $basic" ls-remote \
            "${{{{ github.server_url }}}}/${{{{ github.repository_owner }}}}/tools" > /dev/null 2>&1 \
            || echo "row the task token is refused another private repository of the owner"
"""


ORGS = itertools.count(1)
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT[0-9:.]+Z ")
EXPECTED = [
    "row hello pre ran",  # `pre` of the job's remote Node action, at "Set up job"
    "row checked out the private app",
    "row hello pre ran",  # the nested action's `pre` runs just before its `main` (docs/actions.md)
    "row hello remote-nested from node at {org}/hello",
    "row hello direct from node at {org}/hello",
    "row local: hello local from the private app",
    "row remote: hello remote from the composite action / hello remote-nested from node at {org}/hello",
    "row node: hello direct from node at {org}/hello",
    "row anonymous read refused",
    "row the task token reads the private repository",
    "row the task token is refused another private repository of the owner",
    "row hello post ran",
    "row hello post ran",
]


def printed(log: str | list[str], org: str) -> list[str]:
    """The `row …` rows the job printed, with the organisation's name made `{org}`."""
    rows = log.splitlines() if isinstance(log, str) else log
    found = [TIMESTAMP.sub("", row).replace(org, "{org}") for row in rows]
    return [row for row in found if row.startswith("row ")]


async def test_actions_hosted_in_gitea_and_a_private_checkout_with_the_task_token(
    real_gitea: RealGitea, tmp_path: Path
) -> None:
    gitea = real_gitea
    org = f"acts{next(ORGS)}"
    await asyncio.to_thread(gitea.create_org, org)
    for name, files in (("checkout", CHECKOUT), ("hello", HELLO), ("greet", greet(org))):
        repo = await asyncio.to_thread(gitea.create_repo, org, name)
        await asyncio.to_thread(gitea.commit_files, repo, files, "the action")
        await asyncio.to_thread(gitea.create_tag, repo, "v1")
    app = await asyncio.to_thread(gitea.create_repo, org, "app", private=True)
    await asyncio.to_thread(gitea.create_repo, org, "tools", private=True)
    async with peer_controller(gitea.url, gitea.registration_token, tmp_path, cache=False):
        files = {**APP, ".gitea/workflows/ci.yml": workflow(org)}
        await asyncio.to_thread(gitea.commit_files, app, files, "the app")
        runs = await wait_runs(gitea, [app])
    run = runs.get(app)
    assert run is not None and run.status == "success", f"Gitea {gitea.version}: {describe(run)}"
    [job] = run.jobs
    assert printed(job.log, org) == EXPECTED, f"Gitea {gitea.version}:\n{job.log}"
    assert f"Download action repository '{org}/checkout@v1'" in job.log

    def publish(double: GiteaDouble) -> None:
        for name, files in (("checkout", CHECKOUT), ("hello", HELLO), ("greet", greet(org))):
            double.create_repository(f"{org}/{name}")
            double.commit(f"{org}/{name}", files, tags=["v1"])
        double.create_repository(f"{org}/app", private=True)
        double.commit(f"{org}/app", APP)
        double.create_repository(f"{org}/tools", private=True)
        double.commit(f"{org}/tools", {"README": "tools\n"})

    status, logs = await run_on_double(
        gitea.line,
        tmp_path / "double",
        f"{org}/app",
        workflow(org),
        prepare=publish,
        options={"default_actions_url": "self"},
    )
    assert status == "success", "the double:\n" + "\n".join(logs.get("build", []))
    assert printed(logs["build"], org) == EXPECTED, "the double:\n" + "\n".join(logs["build"])
