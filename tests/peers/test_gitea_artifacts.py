"""Artifacts v4 between two jobs with the real `@actions/artifact` client against real Gitea
(1.24, 1.25, 1.26), and a cache saved and restored with the real `@actions/cache` client
against the controller's cache server.

Two Node actions hosted in that Gitea, built as ncc builds real ones (tests/fixtures/
action_bundles.py): the executor opens the toolkit's GitHub-only gates in their bundles as
Gitea's runner does, so the artifact client speaks v4 (twirp at `ACTIONS_RESULTS_URL`, which
the cache server forwards to Gitea; the bytes go to the upload URL Gitea signs) and the cache
client v2. The first run's `build` job misses the cache, saves it in the action's post stage
and uploads two artifacts (a text file, 3 MB of random bytes); `test` downloads both and
checks their digests; the artifacts are read back through Gitea's REST API as a user would
download them. A second push's run restores the first run's cache. The first run also runs
against the Gitea double answering as that release: both print the same rows.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import re
import zipfile
from pathlib import Path

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.action_bundles import artifact_action, cache_action
from tests.fixtures.clients import ActionClients
from tests.fixtures.peer_controller import describe, peer_controller, run_on_double, wait_runs
from tests.fixtures.real_gitea import RealGitea

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

BLOB_BYTES = 3_000_000


def workflow(org: str) -> str:
    return f"""\
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    steps:
      - uses: {org}/cache@v1
        with:
          key: deps-${{{{ github.run_number }}}}
          restore-keys: deps-
          path: deps
      - run: |
          if [ -f deps/stamp ]; then echo "row deps from run $(cat deps/stamp)"; else echo "row no deps yet"; fi
          mkdir -p deps dist && echo "${{{{ github.run_number }}}}" > deps/stamp
          echo "built in run ${{{{ github.run_number }}}}" > dist/out.txt
          head -c {BLOB_BYTES} /dev/urandom > dist/blob.bin
          echo "blob=$(sha256sum dist/blob.bin | cut -d' ' -f1)" >> "$GITHUB_OUTPUT"
        id: make
      - uses: {org}/artifacts@v1
        with:
          mode: upload
          name: dist
          path: dist/out.txt
      - uses: {org}/artifacts@v1
        with:
          mode: upload
          name: blob
          path: dist/blob.bin
    outputs:
      blob: ${{{{ steps.make.outputs.blob }}}}
  test:
    needs: build
    runs-on: [self-hosted, local]
    steps:
      - uses: {org}/artifacts@v1
        with:
          mode: download
          name: dist
          path: got
      - uses: {org}/artifacts@v1
        with:
          mode: download
          name: blob
          path: got
      - run: |
          echo "row $(cat got/out.txt)"
          test "$(sha256sum got/blob.bin | cut -d' ' -f1)" = "${{{{ needs.build.outputs.blob }}}}" \\
            && echo "row the blob arrived whole"
"""


ORGS = itertools.count(1)
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT[0-9:.]+Z ")
OURS = re.compile(r"^(row |cache |uploaded |downloaded )")
FIRST_RUN = {
    "build": [
        "cache protocol v2",
        "cache miss",
        "row no deps yet",
        "uploaded dist: {size} bytes",
        "uploaded blob: {size} bytes",
        "cache saved as deps-1",
    ],
    "test": ["downloaded dist", "downloaded blob", "row built in run 1", "row the blob arrived whole"],
}


def printed(log: str | list[str]) -> list[str]:
    """The rows the job and the actions printed, sizes made `{size}` (the zip's own size)."""
    rows = log.splitlines() if isinstance(log, str) else log
    found = [TIMESTAMP.sub("", row) for row in rows]
    return [re.sub(r": \d+ bytes$", ": {size} bytes", row) for row in found if OURS.match(row)]


async def test_artifacts_v4_between_jobs_and_the_cache_with_the_real_clients(
    real_gitea: RealGitea, tmp_path: Path, action_clients: ActionClients
) -> None:
    gitea = real_gitea
    org = f"arts{next(ORGS)}"
    actions = {"artifacts": artifact_action(action_clients), "cache": cache_action(action_clients)}
    await asyncio.to_thread(gitea.create_org, org)
    for name, files in actions.items():
        repo = await asyncio.to_thread(gitea.create_repo, org, name)
        await asyncio.to_thread(gitea.commit_files, repo, files, "the action")
        await asyncio.to_thread(gitea.create_tag, repo, "v1")
    app = await asyncio.to_thread(gitea.create_repo, org, "app", private=True)
    async with peer_controller(gitea.url, gitea.registration_token, tmp_path) as controller:
        await asyncio.to_thread(gitea.commit_file, app, ".gitea/workflows/ci.yml", workflow(org))
        first = (await wait_runs(gitea, [app])).get(app)
        assert first is not None and first.status == "success", f"Gitea {gitea.version}: {describe(first)}"
        await asyncio.to_thread(gitea.commit_file, app, "again.txt", "a second push\n")
        second = (await wait_runs(gitea, [app], number=2)).get(app)
        assert second is not None and second.status == "success", f"Gitea {gitea.version}: {describe(second)}"
        cache_url = controller.cache_url
    assert cache_url.startswith("http://127.0.0.1:")
    got = {job.name: printed(job.log) for job in first.jobs}
    assert got == FIRST_RUN, f"Gitea {gitea.version}: {describe(first)}"
    build = next(job for job in second.jobs if job.name == "build")
    assert "cache restored from deps-1" in printed(build.log), describe(second)
    assert "row deps from run 1" in printed(build.log), describe(second)

    # What Gitea kept: two artifacts per run, downloadable by a user as the client uploaded them.
    stored = await asyncio.to_thread(gitea.artifacts, app)
    first_run = min(a["workflow_run"]["id"] for a in stored)  # 1.24's read_run has no run ID
    of_first = {a["name"]: a for a in stored if a["workflow_run"]["id"] == first_run}
    assert {"dist", "blob"} <= set(of_first), stored
    text = zipfile.ZipFile(io.BytesIO(await asyncio.to_thread(gitea.artifact_zip, app, of_first["dist"]["id"])))
    assert text.namelist() == ["out.txt"] and text.read("out.txt").decode().startswith("built in run ")
    blob = zipfile.ZipFile(io.BytesIO(await asyncio.to_thread(gitea.artifact_zip, app, of_first["blob"]["id"])))
    assert blob.namelist() == ["blob.bin"] and len(blob.read("blob.bin")) == BLOB_BYTES

    def publish(double: GiteaDouble) -> None:
        for name, files in actions.items():
            double.create_repository(f"{org}/{name}")
            double.commit(f"{org}/{name}", files, tags=["v1"])
        double.create_repository(f"{org}/app", private=True)

    status, logs = await run_on_double(
        gitea.line,
        tmp_path / "double",
        f"{org}/app",
        workflow(org),
        prepare=publish,
        options={"default_actions_url": "self"},
    )
    assert status == "success", "the double:\n" + "\n".join(logs.get("build", []) + logs.get("test", []))
    assert {name: printed(rows) for name, rows in logs.items()} == FIRST_RUN, logs


NO_CACHE = """\
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    steps:
      - run: mkdir dist && echo "built without a cache server" > dist/out.txt
      - uses: {org}/artifacts@v1
        with:
          mode: upload
          name: dist
          path: dist/out.txt
  test:
    needs: build
    runs-on: [self-hosted, local]
    steps:
      - uses: {org}/artifacts@v1
        with:
          mode: download
          name: dist
          path: got
      - run: echo "row $(cat got/out.txt)"
"""


async def test_artifacts_v4_without_a_cache_server(
    real_gitea: RealGitea, tmp_path: Path, action_clients: ActionClients
) -> None:
    """A pool without a cache server hands jobs Gitea's own `ACTIONS_RESULTS_URL`: the upload
    URL reaches the client as Gitea signed it. On 1.24 its padded `sig` survives the blob
    client only through the executor's edit of the fetched bundle (docs/actions.md)."""
    gitea = real_gitea
    org = f"arts{next(ORGS)}"
    await asyncio.to_thread(gitea.create_org, org)
    repo = await asyncio.to_thread(gitea.create_repo, org, "artifacts")
    await asyncio.to_thread(gitea.commit_files, repo, artifact_action(action_clients), "the action")
    await asyncio.to_thread(gitea.create_tag, repo, "v1")
    app = await asyncio.to_thread(gitea.create_repo, org, "app")
    async with peer_controller(gitea.url, gitea.registration_token, tmp_path, cache=False):
        await asyncio.to_thread(gitea.commit_file, app, ".gitea/workflows/ci.yml", NO_CACHE.format(org=org))
        run = (await wait_runs(gitea, [app])).get(app)
    assert run is not None and run.status == "success", f"Gitea {gitea.version}: {describe(run)}"
    test = next(job for job in run.jobs if job.name == "test")
    assert "row built without a cache server" in printed(test.log), describe(run)
