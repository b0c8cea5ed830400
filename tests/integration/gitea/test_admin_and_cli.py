"""The JSON admin API and the `dynrunner-gitea-double serve` process."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pyqwest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, Result, RunnerCredentials
from tests.fixtures.gitea_calls import final_state, job, register, workflow


async def _admin(url: str, method: str, path: str, body: object = None) -> tuple[int, Any]:
    content = json.dumps(body).encode() if body is not None else None
    response = await pyqwest.Client().execute(
        method, f"{url}/_double/{path}", headers={"content-type": "application/json"}, content=content
    )
    return response.status, json.loads(response.content)


async def test_the_admin_api_submits_runs_and_reads_results(gitea: GiteaDouble) -> None:
    status, run = await _admin(
        gitea.url, "POST", "runs", {"repository": "acme/app", "workflow": workflow(job("build")), "vars": {"A": "1"}}
    )
    assert status == 200 and isinstance(run, dict)
    assert run["status"] == "waiting" and run["jobs"][0]["name"] == "build"
    runner = await register(gitea)
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None and fetched.task.vars["A"] == "1"
    await runner.update_task(final_state(fetched.task.id, Result.SUCCESS), {"o": "v"})
    status, task = await _admin(gitea.url, "GET", f"tasks/{fetched.task.id}")
    assert status == 200 and isinstance(task, dict)
    assert task["status"] == "success" and task["outputs"] == {"o": "v"}
    status, jobs = await _admin(gitea.url, "GET", f"runs/{run['id']}/jobs")
    assert status == 200 and [j["status"] for j in jobs] == ["success"]
    status, runners = await _admin(gitea.url, "GET", "runners")
    assert status == 200 and [r["name"] for r in runners] == ["runner"]


async def test_the_admin_api_accepts_workflow_objects_and_cancels(gitea: GiteaDouble) -> None:
    body = {
        "repository": "acme/app",
        "workflow": {"on": "push", "jobs": {"a": {"runs-on": "x", "steps": [{"run": "true"}]}}},
    }
    status, run = await _admin(gitea.url, "POST", "runs", body)
    assert status == 200 and isinstance(run, dict)
    status, cancelled = await _admin(gitea.url, "POST", f"runs/{run['id']}/cancel")
    assert status == 200 and cancelled["status"] == "cancelled"


async def test_the_admin_api_explains_bad_requests(gitea: GiteaDouble) -> None:
    assert (await _admin(gitea.url, "POST", "runs", {"repository": "acme/app"}))[0] == 400
    status, error = await _admin(gitea.url, "POST", "runs", {"repository": "acme/app", "workflow": "jobs: 3"})
    assert status == 400 and "no jobs" in error["error"]
    bad_step = "on: push\njobs:\n  a:\n    steps:\n      - run: x\n        continue-on-error: ${{ true }}\n"
    status, error = await _admin(gitea.url, "POST", "runs", {"repository": "acme/app", "workflow": bad_step})
    assert status == 400 and "continue-on-error" in error["error"]
    assert (await _admin(gitea.url, "GET", "runs/999"))[0] == 404
    assert (await _admin(gitea.url, "GET", "tasks/999"))[0] == 404
    assert (await _admin(gitea.url, "DELETE", "runs"))[0] == 405


async def test_registration_tokens_through_the_admin_api(gitea: GiteaDouble) -> None:
    status, current = await _admin(gitea.url, "GET", "registration-token")
    assert status == 200 and current == {"token": gitea.registration_token}
    status, scoped = await _admin(gitea.url, "POST", "registration-token", {"repo": "acme/app"})
    assert status == 200 and scoped["token"] != gitea.registration_token


async def test_the_serve_command_prints_its_address_serves_and_stops_cleanly(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "dynrunner-gitea-double"
    process = await asyncio.create_subprocess_exec(
        str(script),
        "serve",
        "--state-dir",
        str(tmp_path / "state"),
        "--pbkdf2-iterations",
        "1000",
        "--zombie-timeout",
        "120",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        ready = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=20))
        assert ready["url"].startswith("http://127.0.0.1:")
        client = GiteaClient(ready["url"])
        info = await client.register(name="cli", registration_token=ready["registration_token"], labels=["x"])
        runner = client.with_credentials(RunnerCredentials(info.uuid, info.token))
        status, _ = await _admin(
            ready["url"], "POST", "runs", {"repository": "o/r", "workflow": workflow(job("a", "x"))}
        )
        assert status == 200
        assert (await runner.fetch_task(0)).task is not None
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=20) == 0
    assert (tmp_path / "state" / "gitea.db").exists()


async def test_repositories_and_commits_through_the_admin_api(gitea: GiteaDouble) -> None:
    status, repo = await _admin(gitea.url, "POST", "repos", {"repository": "acme/lib", "private": True})
    assert status == 200 and repo["private"] is True and repo["clone_url"] == f"{gitea.url}/acme/lib.git"
    assert (await _admin(gitea.url, "POST", "repos", {"repository": "acme/lib"}))[0] == 409
    body = {"files": {"a.txt": "a"}, "files_base64": {"b.bin": "AAE="}, "tags": ["v2"], "message": "m"}
    status, commit = await _admin(gitea.url, "POST", "repos/acme/lib/commits", body)
    assert status == 200 and commit["branch"] == "main" and commit["tags"] == ["v2"]
    status, repo = await _admin(gitea.url, "GET", "repos/acme/lib")
    assert repo["refs"] == {"refs/heads/main": commit["sha"], "refs/tags/v2": commit["sha"]}
    assert (await _admin(gitea.url, "GET", "repos/acme/none"))[0] == 404
    status, error = await _admin(gitea.url, "POST", "repos/acme/lib/commits", {"files_base64": {"x": "%%"}})
    assert status == 400 and "base64" in error["error"]


async def test_the_repo_commands_create_a_repository_and_commit_a_directory(gitea: GiteaDouble, tmp_path: Path) -> None:
    script = str(Path(sys.executable).parent / "dynrunner-gitea-double")
    tree = tmp_path / "action"
    (tree / "dist").mkdir(parents=True)
    (tree / "action.yml").write_text("name: a\nruns: {using: node20, main: dist/index.js}\n")
    (tree / "dist" / "index.js").write_text("console.log(1)\n")
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)

    async def cli(*args: str) -> tuple[int, bytes]:
        process = await asyncio.create_subprocess_exec(
            script, "repo", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await process.communicate()
        return process.returncode or 0, out

    code, out = await cli("create", "--url", gitea.url, "acme/action")
    assert code == 0 and json.loads(out)["full_name"] == "acme/action"
    code, out = await cli("commit", "--url", gitea.url, "acme/action", str(tree), "--tag", "v1")
    assert code == 0, out
    sha = json.loads(out)["sha"]
    assert gitea.repository("acme/action").refs["refs/tags/v1"] == sha
    listing = await asyncio.create_subprocess_exec(
        "git", "ls-tree", "-r", sha, cwd=gitea.engine.repos.git.path("acme", "action"), stdout=asyncio.subprocess.PIPE
    )
    modes = {line.split()[-1]: line.split()[0] for line in (await listing.communicate())[0].decode().splitlines()}
    assert modes == {"action.yml": "100644", "dist/index.js": "100644", "run.sh": "100755"}
    code, out = await cli("create", "--url", gitea.url, "acme/action")
    assert code != 0 and b"already exists" in out
