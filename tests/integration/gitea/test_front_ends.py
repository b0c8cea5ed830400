"""The client behind strict HTTP front ends (load balancers, reverse proxies) in front of Gitea."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator

import pyqwest
import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import ErrorPage, GiteaClient, RequestTooLarge, RunnerCredentials, TaskState
from dynrunner.proto.gitea.client import MAX_REQUEST_BYTES
from tests.fixtures.faults import fault_proxy
from tests.fixtures.gitea_calls import POD, job, workflow

FETCH = "/api/actions/runner.v1.RunnerService/FetchTask"
UPDATE_TASK = "/api/actions/runner.v1.RunnerService/UpdateTask"
MIB = 1024 * 1024


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


async def test_a_body_limited_front_end_answers_413_like_nginx(gitea: GiteaDouble) -> None:
    async with fault_proxy(gitea.url, max_body=MIB) as proxy:
        http = pyqwest.Client()
        response = await http.post(f"{proxy.url}{UPDATE_TASK}", content=b"x" * (MIB + 1))
        assert response.status == 413
        assert await _chunked_status(proxy.url, MIB + 1) == 413  # counted as it arrives
        assert await _chunked_status(proxy.url, 10) != 413
        assert proxy.answered == [(413, UPDATE_TASK), (413, UPDATE_TASK)]
        assert proxy.forwarded == [(UPDATE_TASK, 10)]


async def test_an_update_task_over_768_kib_goes_compressed(gitea: GiteaDouble) -> None:
    """The request a reporter cannot split, an output of 1 MiB (Gitea's largest): plain it is
    over nginx's default limit (RequestTooLarge, not retried); gzip-compressed it passes."""
    gitea.submit("owner/repo", workflow(job("build")))
    value = base64.b64encode(os.urandom(MIB)).decode()[:MIB]
    async with fault_proxy(gitea.url, max_body=MIB) as proxy:
        base = GiteaClient(proxy.url)
        info = await base.register(name="r", registration_token=gitea.registration_token, labels=list(POD))
        credentials = RunnerCredentials(info.uuid, info.token)
        fetched = await base.with_credentials(credentials).fetch_task(0)
        assert fetched.task is not None
        state = TaskState(id=fetched.task.id)
        plain = GiteaClient(proxy.url, credentials, compress_above_bytes=None)
        with pytest.raises(RequestTooLarge):
            await plain.update_task(state, {"big": value})
        answer = await GiteaClient(proxy.url, credentials).update_task(state, {"big": value})
        assert answer.sent_outputs == {"big"}
        assert proxy.answered == [(413, UPDATE_TASK)]
        assert MAX_REQUEST_BYTES < proxy.forwarded[-1][1] < MIB
    assert gitea.task(fetched.task.id).outputs == {"big": value}


async def _chunked_status(url: str, size: int) -> int:
    """POST `size` bytes with chunked transfer encoding (an async body has no length)."""

    async def body() -> AsyncIterator[bytes]:
        for start in range(0, size, 65536):
            yield b"x" * min(65536, size - start)

    response = await pyqwest.Client().post(f"{url}{UPDATE_TASK}", content=body())
    return response.status


async def test_a_front_end_that_replaces_error_pages_hides_what_gitea_said(gitea: GiteaDouble) -> None:
    """nginx's `proxy_intercept_errors` (or a CDN's error pages) replaces the body of every
    5xx: Gitea answers each failure as a 500 with a Connect body, so "unregistered runner"
    reaches the client as a bare error page; answers that succeed pass untouched."""
    async with fault_proxy(gitea.url, intercept_errors=True) as proxy:
        base = GiteaClient(proxy.url)
        info = await base.register(name="r", registration_token=gitea.registration_token, labels=list(POD))
        runner = base.with_credentials(RunnerCredentials(info.uuid, info.token))
        gitea.submit("owner/repo", workflow(job("build", steps=40)))
        fetched = await runner.fetch_task(0)  # a large, gzip-compressed answer passes whole
        assert fetched.task is not None and len(fetched.task.workflow_payload or b"") > 1024
        await runner.update_task(TaskState(id=fetched.task.id))
        stranger = base.with_credentials(RunnerCredentials("no-such-runner", "x"))
        with pytest.raises(ErrorPage) as caught:
            await stranger.fetch_task(0)
        assert caught.value.transient and caught.value.wire == "Internal Server Error"
        assert proxy.intercepted == {FETCH: 1}
        assert (await runner.fetch_task(fetched.tasks_version)).task is None  # the connection still works
