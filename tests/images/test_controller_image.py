"""The controller image, built from a debootstrap-made Debian base: it starts from its own
entrypoint and command with a mounted configuration, runs an embedded NATS in its writable
state directory as a non-root user under tini, answers `/readyz`, runs a job of the Gitea
double in a `local` pool, serves its health endpoints on the published port, and stops
cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.images import IMAGE_UID, Engine, free_port, hand_to_image_user

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def write_config(directory: Path, gitea_url: str, registration_token: str) -> Path:
    """The files an admin mounts at /etc/dynrunner: config, registration token, sealing key."""
    directory.mkdir()
    token = directory / "registration-token"
    token.write_text(registration_token + "\n")
    key = directory / "sealing.key"
    key.write_text(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
    config = directory / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "gitea": {"url": gitea_url, "registrationTokenFile": "/etc/dynrunner/registration-token"},
                "sealing": {"keyFile": "/etc/dynrunner/sealing.key"},
                "pools": [{"name": "local", "labels": ["self-hosted", "local"], "maxConcurrency": 2}],
            }
        )
    )
    for path in (token, key, config):
        hand_to_image_user(path)
    return directory


class Running:
    """A detached controller container, removed when done."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine, self.name = engine, name

    async def alive(self) -> bool:
        code, out, _ = await self.engine.call("inspect", "--format", "{{.State.Running}}", self.name)
        return code == 0 and out.strip() == "true"

    async def logs(self) -> str:
        _, out, err = await self.engine.call("logs", self.name)
        return out + err

    async def exec(self, *command: str) -> str:
        code, out, err = await self.engine.call("exec", self.name, *command)
        assert code == 0, err
        return out

    async def wait_for(self, url: str, status: int, timeout_s: float = 90) -> httpx.Response:
        """Poll `url` until it answers `status`; fail early, with the logs, if the container ends."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                try:
                    response = await client.get(url)
                    if response.status_code == status:
                        return response
                except httpx.TransportError:
                    response = None
                if not await self.alive() or asyncio.get_running_loop().time() > deadline:
                    last = "no answer" if response is None else f"{response.status_code} {response.text}"
                    raise AssertionError(f"{url} never answered {status} ({last}):\n{await self.logs()}")
                await asyncio.sleep(0.5)

    async def stop(self) -> int:
        """SIGTERM (podman stop) and the exit status."""
        code, _, err = await self.engine.call("stop", "--time", "30", self.name)
        assert code == 0, err
        _, out, _ = await self.engine.call("inspect", "--format", "{{.State.ExitCode}}", self.name)
        return int(out.strip())


@asynccontextmanager
async def start(engine: Engine, image: str, config_dir: Path, *options: str) -> AsyncIterator[Running]:
    name = f"dynrunner-test-controller-{os.getpid()}-{secrets.token_hex(3)}"
    code, _, err = await engine.call(
        "run",
        "--detach",
        "--name",
        name,
        *engine.run_flags,
        "--volume",
        f"{config_dir}:/etc/dynrunner:ro",
        *options,
        image,
    )
    assert code == 0, err
    try:
        yield Running(engine, name)
    finally:
        await engine.call("rm", "--force", name)


JOB = """
on: push
jobs:
  hello:
    runs-on: [self-hosted, local]
    steps:
      - run: echo "hello from a local pool of the controller image, as uid $(id -u)"
"""


async def test_the_controller_image_answers_readyz_and_runs_a_job_of_the_double(
    engine: Engine, controller_image: str, gitea: GiteaDouble, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "etc", gitea.url, gitea.registration_token)
    port = free_port()
    # The host's network, to reach the double on 127.0.0.1; the health listener on a free port.
    options = ("--network", "host", "--env", f"DYNRUNNER_METRICS_ADDRESS=127.0.0.1:{port}")
    async with start(engine, controller_image, config, *options) as controller:
        ready = await controller.wait_for(f"http://127.0.0.1:{port}/readyz", 200)
        assert ready.status_code == 200
        runners = [r for r in gitea.runners() if r.name.startswith("dynrunner-local-")]
        assert runners, "the controller registered no runner with the double"
        assert runners[0].labels == ["self-hosted", "local"]
        assert (await controller.exec("id", "-u")).strip() == str(IMAGE_UID)
        assert (await controller.exec("cat", "/proc/1/comm")).strip() == "tini"
        run = gitea.submit("acme/app", JOB)
        done = await gitea.wait_run(run.id, timeout_s=120)
        [job] = done.jobs
        log = gitea.task(job.task_id).log_rows
        assert done.status == "success", log
        assert f"hello from a local pool of the controller image, as uid {IMAGE_UID}" in log
        # The embedded NATS stores into the image's state directory.
        assert "jetstream" in (await controller.exec("ls", "/var/lib/dynrunner/nats"))
        assert await controller.stop() == 0, await controller.logs()


async def test_the_controller_image_serves_health_on_its_published_port(
    engine: Engine, controller_image: str, tmp_path: Path
) -> None:
    # Its own network: nothing answers at this Gitea URL inside the container; the controller
    # runs anyway, alive but not ready, and says why.
    config = write_config(tmp_path / "etc", "http://127.0.0.1:9", "unused-token")
    port = free_port()
    async with start(engine, controller_image, config, "--publish", f"127.0.0.1:{port}:9464") as controller:
        health = await controller.wait_for(f"http://127.0.0.1:{port}/healthz", 200)
        assert health.status_code == 200
        async with httpx.AsyncClient(timeout=5) as client:
            ready = await client.get(f"http://127.0.0.1:{port}/readyz")
            metrics = await client.get(f"http://127.0.0.1:{port}/metrics")
        assert ready.status_code == 503
        assert ready.text.startswith("not ready: claiming keeps failing in pools local"), ready.text
        assert metrics.status_code == 200
        assert "dynrunner_" in metrics.text
        assert await controller.stop() == 0, await controller.logs()
