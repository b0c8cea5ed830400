"""The reporter behind a front end that limits request bodies (nginx's `client_max_body_size`)."""

from __future__ import annotations

import base64
import os
from dataclasses import replace

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.executor.reporter import Reporter, ReporterConfig
from dynrunner.proto.gitea import GiteaClient, Result
from dynrunner.proto.gitea.client import MAX_REQUEST_BYTES
from dynrunner.proto.masking import Masker
from tests.fixtures.faults import fault_proxy
from tests.fixtures.reporter_claims import ClaimTask

MIB = 1024 * 1024
CONFIG = ReporterConfig(
    log_interval_s=0.05, log_max_latency_s=0.05, heartbeat_s=0.2, retry_initial_s=0.02, retry_max_s=0.1
)
UPDATE_TASK = "/api/actions/runner.v1.RunnerService/UpdateTask"
UPDATE_LOG = "/api/actions/runner.v1.RunnerService/UpdateLog"


def mebibyte_of_text(tag: str) -> str:
    """1 MiB (Gitea's largest output) of base64, which compresses least of common output text."""
    return (tag + base64.b64encode(os.urandom(MIB)).decode())[:MIB]


async def test_outputs_of_a_mebibyte_each_pass_nginx_default_body_limit(gitea: GiteaDouble, claim: ClaimTask) -> None:
    """Gitea keeps outputs from every UpdateTask: they travel in several, each under the limit
    (one output too big to share a request alone, compressed)."""
    c = await claim(steps=2)
    assert c.client.credentials is not None
    values = {f"big{i}": mebibyte_of_text(str(i)) for i in range(3)}
    values |= {"small": "1.2.3", "medium": "m" * 300_000}
    async with fault_proxy(gitea.url, max_body=MIB) as proxy:
        rep = Reporter(GiteaClient(proxy.url, c.client.credentials), c.task.id, Masker(), CONFIG)
        await rep.start(2)
        rep.step_started(0)
        rep.log("building", step=0)
        rep.step_finished(0, Result.SUCCESS)
        rep.set_outputs(values)
        rep.step_started(1)
        rep.step_finished(1, Result.SUCCESS)
        assert await rep.close(Result.SUCCESS)
    task = gitea.task(c.task.id)
    assert task.outputs == values
    assert (task.status, [s.status for s in task.steps]) == ("success", ["success", "success"])
    assert proxy.answered == [] and rep.error is None
    bodies = [size for path, size in proxy.forwarded if path == UPDATE_TASK]
    assert len(bodies) >= 4 and max(bodies) <= MIB


async def test_log_batches_stay_under_the_request_size(gitea: GiteaDouble, claim: ClaimTask) -> None:
    """Rows at Gitea's 64 KiB limit, multi-byte text and floods of short rows: no UpdateLog
    body exceeds `MAX_REQUEST_BYTES` (with the default batch limits)."""
    c = await claim(steps=1)
    assert c.client.credentials is not None
    async with fault_proxy(gitea.url, max_body=MAX_REQUEST_BYTES) as proxy:
        rep = Reporter(
            GiteaClient(proxy.url, c.client.credentials), c.task.id, Masker(), replace(CONFIG, closing_line=False)
        )
        await rep.start(1)
        rep.step_started(0)
        rows = 0
        for burst in range(3):
            rep.log("\n".join(["é" * 40_000] * 30), step=0)  # 80 KB each, cut to 64 KiB
            rep.log("\n".join(f"line {burst}.{i}" for i in range(20_000)), step=0)
            rep.log("x" * 65_000, step=0)
            rows += 30 + 20_000 + 1
        rep.step_finished(0, Result.SUCCESS)
        assert await rep.close(Result.SUCCESS)
    assert proxy.answered == []
    bodies = [size for path, size in proxy.forwarded if path == UPDATE_LOG]
    assert max(bodies) <= MAX_REQUEST_BYTES
    assert gitea.task(c.task.id).log_length == rows + 1
