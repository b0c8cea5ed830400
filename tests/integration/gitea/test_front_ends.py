"""The client behind strict HTTP front ends (load balancers, reverse proxies) in front of Gitea."""

from __future__ import annotations

import pyqwest
import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, RunnerCredentials
from tests.fixtures.faults import fault_proxy
from tests.integration.gitea.helpers import POD, job, workflow

FETCH = "/api/actions/runner.v1.RunnerService/FetchTask"


async def test_a_strict_front_end_answers_411_to_a_post_that_declares_no_length(gitea: GiteaDouble) -> None:
    """What the proxy stands for: HTTP/1.1 lets a request without Content-Length or chunked
    encoding have no body, and strict front ends refuse such a POST with 411."""
    async with fault_proxy(gitea.url, length_required=True) as proxy:
        response = await pyqwest.Client().post(f"{proxy.url}{FETCH}", content=b"")
        assert response.status == 411
        assert proxy.answered == [(411, FETCH)] and proxy.forwarded == []


@pytest.mark.parametrize(
    ("use_json", "gzip_requests"),
    [(False, False), (True, False), (False, True)],
    ids=["proto", "json", "proto+gzip"],
)
async def test_fetch_task_with_version_zero_passes_a_strict_front_end(
    gitea: GiteaDouble, use_json: bool, gzip_requests: bool
) -> None:
    """FetchTask(tasks_version=0) encodes to an empty protobuf body: it must still say
    `Content-Length: 0`, or such a front end answers 411 and the pool never claims."""
    gitea.submit("owner/repo", workflow(job("build")))
    async with fault_proxy(gitea.url, length_required=True) as proxy:
        base = GiteaClient(proxy.url, json=use_json, gzip_requests=gzip_requests)
        info = await base.register(name="r", registration_token=gitea.registration_token, labels=list(POD))
        runner = base.with_credentials(RunnerCredentials(info.uuid, info.token))
        fetched = await runner.fetch_task(0)
        assert fetched.task is not None
        assert (await runner.fetch_task(fetched.tasks_version)).task is None
        assert proxy.answered == []
        assert [path for path, _ in proxy.forwarded].count(FETCH) == 2
