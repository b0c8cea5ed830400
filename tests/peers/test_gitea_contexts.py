"""What a job sees of its task, on real Gitea (1.24, 1.25, 1.26) and on the Gitea double
answering as that release: the `github` context's keys and the values the product and common
workflows read (the cache reads `github.event.repository.id` and `default_branch`), the event
payload's top-level keys, the `runner` context, and the `GITHUB_*`/`GITEA_*` variables of a
step's environment. One executor runs both, so a difference is the server's task: a
divergence of the double (docs/compatibility.md).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path

import pytest

from tests.fixtures.peer_controller import describe, peer_controller, run_on_double, wait_runs
from tests.fixtures.real_gitea import ADMIN, RealGitea

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORKFLOW = """\
on: push
jobs:
  show:
    runs-on: [self-hosted, local]
    steps:
      - name: show
        env:
          GITHUB_CONTEXT: ${{ toJSON(github) }}
          RUNNER_CONTEXT: ${{ toJSON(runner) }}
        run: |
          python3 - <<'EOF'
          import json, os
          github = json.loads(os.environ["GITHUB_CONTEXT"])
          runner = json.loads(os.environ["RUNNER_CONTEXT"])
          event = github.get("event") or {}
          repo = event.get("repository") or {}
          def kind(value):
              return type(value).__name__
          shown = {
              "github keys": sorted(github),
              "event keys": sorted(event),
              "event.repository keys": sorted(repo),
              "event.repository.owner keys": sorted(repo.get("owner") or {}),
              "event.sender keys": sorted(event.get("sender") or {}),
              "event.pusher keys": sorted(event.get("pusher") or {}),
              "event kinds": {k: kind(v) for k, v in sorted(event.items())},
              "runner keys": sorted(runner),
              "env": sorted(k for k in os.environ if k.startswith(("GITHUB_", "GITEA_", "RUNNER_"))),
              "values": {k: github.get(k) for k in VALUES},
              "kinds": {k: kind(github.get(k)) for k in sorted(github)},
              "repository": {k: repo.get(k) for k in ("private", "default_branch", "full_name", "name", "fork")},
              "repository id": kind(repo.get("id")),
          }
          for name, value in shown.items():
              print(f"ctx {name}: {json.dumps(value, sort_keys=True)}")
          EOF
"""
VALUES = [
    "event_name",
    "ref",
    "ref_name",
    "ref_type",
    "ref_protected",
    "head_ref",
    "base_ref",
    "repository",
    "repository_owner",
    "run_number",
    "run_attempt",
    "retention_days",
    "workflow",
    "workflow_ref",
    "job",
    "actor",
    "triggering_actor",
    "action",
]
"""Values that do not name the server (its URL, its ids, the commit)."""

ORGS = itertools.count(1)
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT[0-9:.]+Z ")


def shown(rows: list[str], org: str) -> dict[str, object]:
    found: dict[str, object] = {}
    for row in rows:
        row = TIMESTAMP.sub("", row)
        if row.startswith("ctx "):
            name, _, value = row[4:].partition(": ")
            found[name] = json.loads(value.replace(org, "{org}"))
    return found


async def test_the_double_gives_a_job_the_contexts_gitea_gives(real_gitea: RealGitea, tmp_path: Path) -> None:
    gitea = real_gitea
    org = f"ctx{next(ORGS)}"
    await asyncio.to_thread(gitea.create_org, org)
    repo = await asyncio.to_thread(gitea.create_repo, org, "app")
    workflow = WORKFLOW.replace("for k in VALUES", f"for k in {VALUES!r}")
    async with peer_controller(gitea.url, gitea.registration_token, tmp_path, cache=False):
        await asyncio.to_thread(gitea.commit_file, repo, ".gitea/workflows/ci.yml", workflow)
        run = (await wait_runs(gitea, [repo])).get(repo)
    assert run is not None and run.status == "success", f"Gitea {gitea.version}: {describe(run)}"
    real = shown(run.jobs[0].log.splitlines(), org)
    status, logs = await run_on_double(
        gitea.line, tmp_path / "double", f"{org}/app", workflow, workflow_file="ci.yml", actor=ADMIN
    )
    assert status == "success", "the double:\n" + "\n".join(logs["show"])
    double = shown(logs["show"], org)
    differences = []
    for name in real.keys() | double.keys():
        want, got = real.get(name), double.get(name)
        if want == got:
            continue
        if isinstance(want, list) and isinstance(got, list):
            differences.append(
                f"{name}: only Gitea {sorted(set(want) - set(got))}, only the double {sorted(set(got) - set(want))}"
            )
        elif isinstance(want, dict) and isinstance(got, dict):
            keys = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
            differences.append(
                f"{name}: " + ", ".join(f"{k}: Gitea {want.get(k)!r}, double {got.get(k)!r}" for k in keys)
            )
        else:
            differences.append(f"{name}: Gitea {want!r}, double {got!r}")
    assert not differences, f"Gitea {gitea.version} and the double differ:\n" + "\n".join(sorted(differences))
