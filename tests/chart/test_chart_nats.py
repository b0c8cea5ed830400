"""The bundled NATS server's configuration, as the chart renders it, run by a real nats-server:
the controller's user, with exactly the subjects docs/configuration.md#nats lists, runs jobs end
to end (claim, publish, the registration and launch-record buckets, launch, ack); a client
without the password is refused, and the user may not publish elsewhere."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from dynrunner.controller.assignments.log import AssignmentLog, AssignmentLogError
from dynrunner.controller.config.model import ControllerConfig, NatsConfig, load_config
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.chart import Chart, container_files, one
from tests.fixtures.harness import REAL_EXECUTOR, build_config, in_process, recorded, recording_workflow, wait_run_done
from tests.fixtures.nats import NatsServer

JOBS = 3


@pytest.fixture
def bundled(chart: Chart, tmp_path: Path) -> tuple[NatsServer, str]:
    """A nats-server with the chart's configuration (its ports, address and store directory
    given on the command line, which take precedence), and the generated password."""
    objects = chart.render(["ci/minimal-values.yaml"])
    secret = one(objects, "Secret", "rel-dynrunner")["data"]
    conf = base64.b64decode(secret["nats.conf"]).decode()
    password = base64.b64decode(secret["nats-password"]).decode()
    server = NatsServer(tmp_path / "nats", conf, env={_password_variable(objects): password})
    server.start()
    return server, password


def _controller_config(objects: list[dict[str, Any]], root: Path, password: str) -> ControllerConfig:
    """The controller's configuration from its Pod's files, its NATS password file (which
    stands for the existing Secret's key) holding `password`."""
    files = container_files(objects, "-controller", "controller", root)
    password_file = Path(yaml.safe_load(files.config.read_text())["nats"]["passwordFile"])
    assert password_file.name == "nats-password"
    assert password_file.read_text() == "(nats-bundled/pw)\n"
    password_file.write_text(password)
    return load_config(files.config, files.env)


def _password_variable(objects: list[dict[str, Any]]) -> str:
    """The environment variable the StatefulSet gives nats-server its password in."""
    (container,) = one(objects, "StatefulSet", "-nats")["spec"]["template"]["spec"]["containers"]
    (variable,) = [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    return str(variable["name"])


async def test_a_password_from_an_existing_secret_reaches_server_and_controller(chart: Chart, tmp_path: Path) -> None:
    """With nats.bundled.password.existingSecret the chart never sees the password: the server
    reads it from its environment (nats.conf refers to it), the controller from the same
    Secret's key mounted as its file. A base64 password (what the docs suggest) passes through
    nats-server's parsing of the variable unchanged."""
    existing = {"nats": {"bundled": {"password": {"existingSecret": "nats-bundled", "key": "pw"}}}}
    objects = chart.render(["ci/minimal-values.yaml"], overlay=existing)
    assert "nats-password" not in one(objects, "Secret", "rel-dynrunner")["data"]
    (container,) = one(objects, "StatefulSet", "-nats")["spec"]["template"]["spec"]["containers"]
    (variable,) = container["env"]
    assert variable["valueFrom"]["secretKeyRef"] == {"name": "nats-bundled", "key": "pw"}
    password = base64.b64encode(bytes(range(171, 193))).decode()  # with '+', '/' and '='
    assert set("+/=") <= set(password)
    cfg = _controller_config(objects, tmp_path / "pod", password)
    conf = base64.b64decode(one(objects, "Secret", "rel-dynrunner")["data"]["nats.conf"]).decode()
    server = NatsServer(tmp_path / "nats", conf, env={variable["name"]: password})
    server.start()
    try:
        nc = await nats.connect(server.url, user=cfg.nats.user, password=cfg.nats.password(), allow_reconnect=False)
        await nc.close()
    finally:
        server.close()


async def test_the_controller_runs_jobs_through_the_bundled_servers_permissions(
    bundled: tuple[NatsServer, str], gitea: GiteaDouble, tmp_path: Path
) -> None:
    server, password = bundled
    try:
        password_file = tmp_path / "nats-password"
        password_file.write_text(password)
        cfg = build_config(
            gitea_url=gitea.url,
            registration_token=gitea.registration_token,
            state_dir=tmp_path / "state",
            nats_url=server.url,
            nats={"user": "dynrunner", "passwordFile": str(password_file)},
            executor_command=[REAL_EXECUTOR],
        )
        ran = tmp_path / "ran.log"
        async with in_process(cfg):
            run = gitea.submit("owner/repo", recording_workflow(ran, JOBS))
            done = await wait_run_done(gitea, run.id, within=60)
        assert done.status == "success"
        assert Counter(recorded(ran)) == Counter(f"job{i}" for i in range(JOBS))
        assert "violation" not in server.log_tail(500).lower()
    finally:
        server.close()


async def test_the_bundled_server_admits_only_the_controller_and_only_to_its_subjects(
    bundled: tuple[NatsServer, str],
) -> None:
    server, password = bundled
    try:
        with pytest.raises(AssignmentLogError, match="cannot connect to NATS"):
            await AssignmentLog.connect(server.url, NatsConfig(url=server.url), ["pod"], options={})
        errors: list[Exception] = []

        async def collect(err: Exception) -> None:
            errors.append(err)

        nc = await nats.connect(
            server.url, user="dynrunner", password=password, allow_reconnect=False, error_cb=collect
        )
        try:
            await nc.publish("dynrunner.assignments.pod", b"allowed")
            await nc.publish("elsewhere.secrets", b"refused")
            await nc.flush()
            for _ in range(100):
                if errors:
                    break
                await asyncio.sleep(0.02)
        finally:
            await nc.close()
        assert [str(e) for e in errors] == ['nats: permissions violation for publish to "elsewhere.secrets"']
    finally:
        server.close()
