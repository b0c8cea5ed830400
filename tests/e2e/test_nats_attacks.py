"""End to end: what someone who can publish to the controller's NATS, or kill its embedded
server, can do to it (docs/security.md#nats, docs/operations.md).

* A second NATS client copies an assignment off the stream, then publishes a tampered copy,
  a forged one in the previous (unauthenticated) format pointing at its own server, and a
  replay of the finished original: all are refused, logged and counted; nothing runs again
  and nothing reaches the attacker's server or the victim task in Gitea.
* The embedded nats-server is killed with SIGKILL in the middle of a burst of 100 jobs: it is
  started again, every job runs and ends exactly once, no runner registration is left behind,
  and `/healthz` reported the outage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.assignment import (
    Assignment,
    ClaimingRunner,
    Sealed,
    decode_sealed,
    encode,
    encode_sealed,
)
from dynrunner.proto.gitea import Task
from tests.fixtures.harness import (
    assert_only_armed_runners,
    config_data,
    in_process,
    recording_workflow,
    wait_for,
    wait_run_done,
)


def starts(root: Path) -> list[str]:
    """`<assignment id> <task id>` per executor start (written by the fake executor)."""
    log = root.parent / "starts.log"
    return log.read_text().splitlines() if log.exists() else []


def embedded_config(gitea: GiteaDouble, state: Path, **kwargs: Any) -> ControllerConfig:
    data = config_data(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=state, nats_url=None, **kwargs
    )
    data["metrics"] = {"address": "127.0.0.1:0"}
    return ControllerConfig.model_validate(data)


class Listener:
    """The attacker's server: counts the connections anyone makes to it."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Listener:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def nats_client(cfg: ControllerConfig, running: Any) -> nats.aio.client.Client:
    """A second client of the controller's NATS (with whatever credentials it accepts)."""
    embedded = running.controller._embedded
    assert embedded is not None
    return await nats.connect(embedded.url, **embedded.client_options())


async def test_tampered_forged_and_replayed_assignments_are_refused_and_run_nothing(
    gitea: GiteaDouble, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ran = tmp_path / "ran.log"
    cfg = embedded_config(gitea, tmp_path / "state")
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    subject = f"{cfg.nats.subject_prefix}.local"
    async with in_process(cfg) as running, Listener() as attacker:
        metrics = running.controller.metrics
        tap = await nats_client(cfg, running)
        copied: list[bytes] = []

        async def record(msg: Any) -> None:
            copied.append(msg.data)

        await tap.subscribe(subject, cb=record)
        try:
            await tap.flush()
            run = gitea.submit("victim/app", recording_workflow(ran))
            done = await wait_run_done(gitea, run.id)
            assert done.status == "success"
            await wait_for(lambda: not any(root.iterdir()), what="the environment reaped")
            [original] = copied
            task_id = decode_sealed(original).task_id
            before = gitea.task(task_id)

            js = tap.jetstream()
            sealed = decode_sealed(original)
            flipped = bytearray(sealed.ciphertext)
            flipped[len(flipped) // 2] ^= 1
            tampered = encode_sealed(dataclasses.replace(sealed, ciphertext=bytes(flipped)))
            forged = encode(
                Assignment(
                    assignment_id=sealed.assignment_id,
                    pool="local",
                    backend="local",
                    claimed_at=datetime.now(UTC),
                    task=Task(id=task_id, workflow_payload=recording_workflow(ran, suffix="-attacker").encode()),
                    runner=ClaimingRunner(id=1, uuid="u", token=""),
                    gitea_url=attacker.url,
                    job_key="job0",
                    sealed=Sealed(key_id=sealed.header.key_id, nonce=bytes(12), ciphertext=b"copied"),
                )
            )
            for n, data in enumerate([tampered, forged, original]):
                await js.publish(subject, data, headers={"Nats-Msg-Id": f"attack-{n}"})

            def refused(reason: str) -> float:
                return metrics.sample("dynrunner_assignments_refused_total", pool="local", reason=reason) or 0

            await wait_for(
                lambda: (refused("forged"), refused("unauthenticated"), refused("replayed")) == (1, 1, 1),
                what="all three refused",
            )
            await asyncio.sleep(0.5)  # anything wrongly started would have written by now
        finally:
            await tap.close()
        assert len(starts(root)) == 1
        assert not any(root.iterdir())
        after = gitea.task(task_id)
        assert (after.status, after.log_rows, after.updated) == (before.status, before.log_rows, before.updated)
        assert attacker.connections == 0
        assert (await running.controller._log.pending("local")) == 0  # all three dropped
    text = caplog.text
    assert "assignment refused (forged)" in text and "does not authenticate" in text
    assert "an assignment in the previous format, whose workflow and settings are not authenticated" in text
    assert "assignment refused (replayed)" in text and "is a replay of it" in text
    assert_only_armed_runners(gitea)


JOBS = 100


async def test_a_killed_embedded_nats_server_mid_burst_loses_repeats_and_leaks_nothing(
    gitea: GiteaDouble, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.log"
    cfg = embedded_config(
        gitea, tmp_path / "state", max_concurrency=8, nats={"ackWaitSeconds": 3.0, "publishTimeoutSeconds": 30.0}
    )
    root = cfg.pools[0].backend.root_dir
    assert cfg.nats.data_dir is not None and root is not None
    health: list[tuple[float, int, str]] = []
    async with in_process(cfg) as running, aiohttp.ClientSession() as http:
        url = running.controller.health_url
        stop_polling = asyncio.Event()

        async def poll() -> None:
            while not stop_polling.is_set():
                async with http.get(f"{url}/healthz") as resp:
                    health.append((time.monotonic(), resp.status, await resp.text()))
                await asyncio.sleep(0.01)

        polling = asyncio.create_task(poll())
        runs = [gitea.submit("owner/repo", recording_workflow(ran, 25, name=f"r{i}-")) for i in range(4)]
        await wait_for(lambda: len(starts(root)) >= 30, within=120, what="the burst under way")
        pid = int((cfg.nats.data_dir / "nats-server.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        for run in runs:
            done = await wait_run_done(gitea, run.id, within=180)
            assert done.status == "success", {j.name: gitea.task(j.task_id).log_rows for j in done.jobs if j.task_id}
        await wait_for(lambda: not any(root.iterdir()), within=30, what="every environment reaped")
        stop_polling.set()
        await polling
        metrics = running.controller.metrics
        assert not metrics.sample("dynrunner_finalized_failed_total", pool="local", reason="publish")
        assert running.controller._embedded is not None and running.controller._embedded.restarts == 1
    counts = Counter(line.split()[1] for line in starts(root))  # task ids
    assert len(counts) == JOBS and set(counts.values()) == {1}, counts.most_common(3)
    outage = [(t, body) for t, status, body in health if status == 503 and t >= killed]
    assert outage and "embedded nats-server is down" in outage[0][1], health[-3:]
    assert health[-1][1] == 200
    print(f"/healthz said 503 for {outage[-1][0] - outage[0][0]:.2f}s after the kill ({len(outage)} polls)")
    assert_only_armed_runners(gitea)
