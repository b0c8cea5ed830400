"""Secrets and variables set through Gitea's REST API, used by a job, masked in the stored log,
against real Gitea 1.24, 1.25 and 1.26.

Repository- and organisation-level secrets and variables (`PUT …/actions/secrets/{name}`,
`POST …/actions/variables/{name}`), a repository variable shadowing the organisation's of the
same name, a multi-line secret and the task token: the job prints each, and the log Gitea
stored (read back through REST `actions/jobs/{id}/logs` and through the web route a user's
"Download logs" follows) holds `***` where a secret was and the variables in clear. Then the
same workflow against the Gitea double answering as that release: the rows the job printed
must be the same.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path

import pytest

from tests.fixtures.peer_controller import describe, peer_controller, run_on_double, wait_runs
from tests.fixtures.real_gitea import RealGitea

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO_SECRET = "rs-Zq8vX2kP-repo"
ORG_SECRET = "os-Lm4nB7tY-org"
MULTI_LINE = "ml-first-line-Hj3k\nml-second-line-Pq9w"
SECRETS = {"REPO_SECRET": REPO_SECRET, "MULTI_LINE": MULTI_LINE}
ORG_SECRETS = {"ORG_SECRET": ORG_SECRET}
VARS = {"REPO_VAR": "repo-var-value", "SHARED": "from-the-repository"}
ORG_VARS = {"ORG_VAR": "org-var-value", "SHARED": "from-the-organisation"}
HIDDEN = [REPO_SECRET, ORG_SECRET, *MULTI_LINE.splitlines()]

WORKFLOW = """\
on: push
jobs:
  use:
    runs-on: [self-hosted, local]
    steps:
      - name: print them
        env:
          FROM_ENV: ${{ secrets.ORG_SECRET }}
          MULTI: ${{ secrets.MULTI_LINE }}
          TOKEN: ${{ github.token }}
        run: |
          echo "row repo secret: ${{ secrets.REPO_SECRET }}"
          echo "row lower-case name: ${{ secrets.repo_secret }}"
          echo "row org secret: $FROM_ENV"
          echo "row multi: $MULTI"
          echo "row token: $TOKEN"
          echo "row token length: ${#TOKEN}"
          echo "row repo var: ${{ vars.REPO_VAR }}"
          echo "row org var: ${{ vars.ORG_VAR }}"
          echo "row shadowed var: ${{ vars.SHARED }}"
          echo "row unset secret: [${{ secrets.NOT_SET }}]"
          test "${{ secrets.REPO_SECRET }}" = "REPO_VALUE" && echo "row the repository secret arrived whole"
          test "$FROM_ENV" = "ORG_VALUE" && echo "row the organisation secret arrived whole"
""".replace("REPO_VALUE", REPO_SECRET).replace("ORG_VALUE", ORG_SECRET)

EXPECTED = [
    "row repo secret: ***",
    "row lower-case name: ***",
    "row org secret: ***",
    "row multi: ***",
    "***",
    "row token: ***",
    "row token length: 40",  # a task token is 40 hex digits, on Gitea as on the double
    "row repo var: repo-var-value",
    "row org var: org-var-value",
    "row shadowed var: from-the-repository",
    "row unset secret: []",
    "row the repository secret arrived whole",
    "row the organisation secret arrived whole",
]
"""The job's own rows as both servers must keep them (the multi-line secret is one `***` per
line)."""

ORGS = itertools.count(1)
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT[0-9:.]+Z ")


def rows(log: str) -> list[str]:
    """The log's rows without Gitea's timestamps (REST and web logs prefix every row)."""
    return [TIMESTAMP.sub("", row) for row in log.splitlines()]


def printed(lines: list[str]) -> list[str]:
    """The rows the step printed: from `row repo secret` on (the step's header shows its script),
    the `row …` rows and the one
    `***` row of the multi-line secret's second line, in order."""
    start = next((i for i, row in enumerate(lines) if row.startswith("row repo secret")), len(lines))
    found = []
    for row in lines[start:]:
        ours = row.startswith("row ")
        second_line = row == "***" and bool(found) and found[-1].startswith("row multi")
        if ours or second_line:
            found.append(row)
    return found


async def test_secrets_and_variables_from_the_api_reach_the_job_masked(real_gitea: RealGitea, tmp_path: Path) -> None:
    gitea = real_gitea
    org = f"secrets{next(ORGS)}"
    await asyncio.to_thread(gitea.create_org, org)
    repo = await asyncio.to_thread(gitea.create_repo, org, "app", private=True)
    for name, value in SECRETS.items():
        await asyncio.to_thread(gitea.set_secret, repo, name, value)
    for name, value in VARS.items():
        await asyncio.to_thread(gitea.set_variable, repo, name, value)
    for name, value in ORG_SECRETS.items():
        await asyncio.to_thread(gitea.set_org_secret, org, name, value)
    for name, value in ORG_VARS.items():
        await asyncio.to_thread(gitea.set_org_variable, org, name, value)
    async with peer_controller(gitea.url, gitea.registration_token, tmp_path, cache=False):
        await asyncio.to_thread(gitea.commit_file, repo, ".gitea/workflows/secrets.yml", WORKFLOW)
        runs = await wait_runs(gitea, [repo])
    run = runs.get(repo)
    assert run is not None and run.status == "success", f"Gitea {gitea.version}: {describe(run)}"
    [job] = run.jobs
    rest = job.log
    web = await asyncio.to_thread(gitea.job_log_web, repo, run, 0)
    for where, log in (("REST", rest), ("web", web)):
        leaked = [value for value in [*HIDDEN, gitea.token] if value in log]
        assert not leaked, f"Gitea {gitea.version}: {where} log shows {leaked}:\n{log}"
        assert printed(rows(log)) == EXPECTED, f"Gitea {gitea.version}, {where} log:\n{log}"
    assert rows(rest) == rows(web), "the REST and the web log differ"

    # One contract, two servers: the same job against the double answering as this release.
    status, logs = await run_on_double(
        gitea.line,
        tmp_path / "double",
        "secrets/app",
        WORKFLOW,
        secrets={**SECRETS, **ORG_SECRETS},
        vars={**ORG_VARS, **VARS},
        workflow_file="secrets.yml",
    )
    assert status == "success", f"the double: {logs}"
    assert printed(logs["use"]) == EXPECTED, "the double:\n" + "\n".join(logs["use"])
