"""`dynrunner-controller check` and `run`, the health endpoints, and a graceful shutdown."""

from __future__ import annotations

import asyncio
import io
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from dynrunner.controller.backends.local.backend import LocalBackend
from dynrunner.controller.backends.local.layout import Layout
from dynrunner.controller.checks import run_checks
from dynrunner.controller.startup import StartupError
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.backends import HeldStart
from tests.fixtures.harness import (
    build_config,
    config_data,
    fake_executor_command,
    first_job_log,
    in_process,
    wait_for,
    wait_run_done,
)

ONE_JOB = "on: push\njobs:\n  a:\n    runs-on: [self-hosted, local]\n    steps: [{run: x}]\n"
CONTROLLER = str(Path(sys.executable).parent / "dynrunner-controller")


def write_config(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_check_reports_each_part(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    data = config_data(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    out = io.StringIO()
    assert await run_checks(write_config(tmp_path, data), out) == 0
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "OK   config",
        "OK   sealing key",
        "OK   registration token",
        "OK   gitea",
        "OK   nats",
        "WARN nats",  # the test server admits anyone
        "OK   pool local",
        "WARN pool local",  # its jobs run as this (root) process's user: no runAsUser
    ]
    assert "with JetStream" in lines[4]
    assert "processes contained by " in lines[6]
    assert "are not isolated from it" in lines[7]
    # check changes nothing: no runner was registered
    assert gitea.runners() == []


async def test_check_fails_on_unreachable_services(tmp_path: Path) -> None:
    dead = free_port()
    data = config_data(
        gitea_url=f"http://127.0.0.1:{dead}",
        registration_token="t" * 40,
        state_dir=tmp_path / "s",
        nats_url=f"nats://127.0.0.1:{dead}",
    )
    out = io.StringIO()
    assert await run_checks(write_config(tmp_path, data), out) == 1
    text = out.getvalue()
    assert "FAIL gitea: " in text and "does not answer Ping" in text
    assert "FAIL nats: " in text
    assert "OK   config" in text


async def test_check_says_once_that_nats_cannot_be_reached(tmp_path: Path) -> None:
    """One FAIL line, not one line per connection attempt of the NATS client on stderr."""
    data = config_data(
        gitea_url="http://127.0.0.1:1",
        registration_token="t" * 40,
        state_dir=tmp_path / "s",
        nats_url=f"nats://127.0.0.1:{free_port()}",
    )
    proc = await asyncio.create_subprocess_exec(
        CONTROLLER,
        "check",
        "--config",
        str(write_config(tmp_path, data)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    text = (out + err).decode()
    assert text.count("Connect call failed") == 1, text
    assert "FAIL nats: cannot connect to NATS at nats://127.0.0.1:" in text, text


async def test_check_lists_every_configuration_problem(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"gitea": {"url": "ftp://x"}, "pools": [{"name": "Bad Name", "labels": []}]})
    out = io.StringIO()
    assert await run_checks(path, out) == 1
    text = out.getvalue()
    assert text.startswith("FAIL config: ")
    assert "gitea.url" in text and "pools[0].name" in text and "pools[0].labels" in text


async def test_run_refuses_an_invalid_configuration(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"gitea": {"url": "https://gitea.example.com"}, "pools": []})
    proc = await asyncio.create_subprocess_exec(
        CONTROLLER, "run", "--config", str(path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert b"invalid configuration" in err and b"registration token is required" in err


async def test_health_metrics_and_readiness(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    data = config_data(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    data["metrics"] = {"address": "127.0.0.1:0"}
    from dynrunner.controller.config.model import ControllerConfig

    cfg = ControllerConfig.model_validate(data)
    async with in_process(cfg) as running, aiohttp.ClientSession() as http:
        url = running.controller.health_url
        async with http.get(f"{url}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{url}/readyz") as resp:
            assert resp.status == 200, await resp.text()
        run = gitea.submit(
            "owner/repo", "on: push\njobs:\n  a:\n    runs-on: [self-hosted, local]\n    steps: [{run: x}]\n"
        )
        await wait_run_done(gitea, run.id)
        async with http.get(f"{url}/metrics") as resp:
            text = await resp.text()
        for name in (
            'dynrunner_capacity{pool="local"} 4.0',
            'dynrunner_capacity_in_use{pool="local"}',
            'dynrunner_fetch_calls_total{outcome="task",pool="local"} 1.0',
            'dynrunner_claimed_to_launched_seconds_count{pool="local"} 1.0',
            'dynrunner_assignments_published_total{pool="local"} 1.0',
            "dynrunner_registrations_total",
        ):
            assert name in text, name


async def test_graceful_stop_leaves_running_jobs_alone(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    state = tmp_path / "s"
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=state, nats_url=nats_url
    )
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    slow = ONE_JOB.replace("steps:", "env: {FAKE_EXECUTOR: 'sleep:2'}\n    steps:")
    starts = root.parent / "starts.log"  # the fake executor's first act
    async with in_process(cfg):
        run = gitea.submit("owner/repo", slow)
        # Running, not just created: an environment exists a few awaits (the launch's ack, the
        # last stage line) before its executor is spawned, and a start the stop finds there is
        # let go to the next controller (the test below).
        await wait_for(starts.exists, what="the executor started")
    # The controller stopped; the job goes on and finishes by itself.
    [env_dir] = list(root.iterdir())
    done = await wait_run_done(gitea, run.id)
    assert done.status == "success"
    assert env_dir.exists()  # nobody reaped it yet
    async with in_process(cfg):
        await wait_for(lambda: not env_dir.exists(), what="the next controller reaped it")


async def test_a_start_the_stop_finds_unspawned_is_left_to_the_next_controller(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    """Stopped after the environment was created, before its executor was spawned (the last
    stage line written): the stop starts nothing and fails nothing; the next controller's
    reaper finds the start untaken, follows it, and the job runs once."""
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    held = HeldStart(LocalBackend("local", root, fake_executor_command()))
    async with in_process(cfg, backends={"local": held}):
        run = gitea.submit("owner/repo", ONE_JOB)
        await wait_for(held.holding.is_set, what="the start held before the spawn")
    [env_dir] = list(root.iterdir())
    starts = root.parent / "starts.log"
    assert not Layout(env_dir).start_file.exists() and not starts.exists()  # nothing spawned
    assert gitea.run(run.id).status == "running"
    assert first_job_log(gitea, run.id).endswith("starting the executor")
    async with in_process(cfg):
        # At once, not at the reaper's 30-s full sweep: the stop released the start's lease.
        done = await wait_run_done(gitea, run.id, within=20)
    assert done.status == "success"
    assert len(starts.read_text().splitlines()) == 1


async def test_a_gitea_url_that_is_not_gitea_stops_the_start(gitea: GiteaDouble, nats_url: str, tmp_path: Path) -> None:
    """A Gitea that does not answer lets the controller start (tests/e2e/test_outages.py); one
    that answers, but not as the runner API (a wrong path in gitea.url), is a configuration
    mistake and stops it."""
    cfg = build_config(
        gitea_url=f"{gitea.url}/not-gitea",
        registration_token=gitea.registration_token,
        state_dir=tmp_path / "s",
        nats_url=nats_url,
    )
    with pytest.raises(StartupError, match=r"does not answer as Gitea's runner API: Unimplemented"):
        async with in_process(cfg):
            pass


def _bad_key(kind: str, path: Path) -> str:
    """Make the sealing key file at `path` bad in one way; returns what `run` and `check` say."""
    if kind == "a directory":
        path.mkdir(parents=True)
        return f"sealing key file {path} cannot be read: Is a directory"
    if kind == "too short":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("c2hvcnQ=\n")
        path.chmod(0o600)
        return f"sealing key file {path} must hold a 256-bit key: 32 raw bytes, 64 hex digits or base64 of 32 bytes"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(path.parent / "gone" / "sealing.key")
    return f"sealing key file {path} is a symbolic link to {path.parent / 'gone' / 'sealing.key'}, which does not exist"


async def run_controller(config: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        CONTROLLER, "run", "--config", str(config), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode()


@pytest.mark.parametrize("kind", ["a directory", "too short", "a dangling symbolic link"])
@pytest.mark.parametrize("nats", ["embedded", "external"])
async def test_a_bad_sealing_key_is_one_line_in_run_and_check(
    kind: str, nats: str, nats_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "s"
    data = config_data(
        gitea_url=f"http://127.0.0.1:{free_port()}",
        registration_token="t" * 40,
        state_dir=state,
        nats_url=nats_url if nats == "external" else None,
    )
    key = state / "sealing.key"
    key.unlink()  # config_data made a good one
    said = _bad_key(kind, key)
    config = write_config(tmp_path, data)
    status, text = await run_controller(config)
    assert status == 1, text
    assert "Traceback" not in text, text
    [line] = text.splitlines()  # one line, nothing else
    assert line.startswith(f"dynrunner-controller: cannot start: {said}"), text
    out = io.StringIO()
    assert await run_checks(config, out) == 1
    assert f"FAIL sealing key: {said}" in out.getvalue()


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["no-such-executor"], "the executor program 'no-such-executor' was not found on PATH or in "),
        (["/nonexistent/executor"], "the executor program '/nonexistent/executor' does not exist (or is not a file)"),
        (["./not-executable"], "the executor program './not-executable' is not executable"),
    ],
)
async def test_a_missing_executor_program_is_one_line_in_run_and_check(
    command: list[str], said: str, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    data = config_data(
        gitea_url=f"http://127.0.0.1:{free_port()}",
        registration_token="t" * 40,
        state_dir=tmp_path / "s",
        nats_url=nats_url,
        executor_command=command,
    )
    config = write_config(tmp_path, data)
    status, text = await run_controller(config)
    assert status == 1, text
    assert "Traceback" not in text, text
    assert text.splitlines()[-1].startswith(f"dynrunner-controller: cannot start: pool local: {said}"), text
    out = io.StringIO()
    assert await run_checks(config, out) == 1
    assert f"FAIL pool local: {said}" in out.getvalue()
