"""Who may ask for an OIDC ID token (`permissions:`), and what the loopback endpoint answers,
with the Workload API replaced by a function (the wire is proven in the integration tier)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dynrunner.executor.idtokens import IdTokenEndpoint, IdTokenError, grant_of
from dynrunner.executor.workflow import parse_workflow

JOB_ID = "spiffe://example.org/ci/owner/repo/deploy"


@pytest.mark.parametrize(
    ("workflow", "job", "granted"),
    [
        (None, None, False),  # no `permissions:` anywhere: GitHub's defaults never hold id-token
        ({"id-token": "write"}, None, True),
        ({"id-token": "read"}, None, False),
        ({"contents": "read"}, None, False),
        ("write-all", None, True),
        ("read-all", None, False),
        ({}, None, False),
        (None, {"id-token": "write"}, True),
        ({"id-token": "write"}, {"contents": "read"}, False),  # the job's block replaces the workflow's
        ({"id-token": "write"}, {}, False),
        ("read-all", {"id-token": "write", "contents": "read"}, True),
        ({"id-token": "write"}, "read-all", False),
        ("bogus", None, False),
    ],
)
def test_grant_follows_github(workflow: Any, job: Any, granted: bool) -> None:
    assert grant_of(workflow, job).granted is granted


def test_grant_reasons_name_where_they_come_from() -> None:
    assert grant_of(None, None).reason == (
        "the workflow sets no `permissions:`, and ID tokens need `permissions: id-token: write`"
    )
    assert grant_of({"id-token": "write"}, {"contents": "read"}).reason == (
        "the job's `permissions:` set id-token: not granted (ID tokens need id-token: write)"
    )
    assert grant_of({"id-token": "write"}, None).reason == "the workflow's `permissions:` grant id-token: write"


def test_workflow_model_keeps_both_permission_blocks() -> None:
    workflow = parse_workflow(
        """
on: push
permissions: read-all
jobs:
  deploy:
    runs-on: self-hosted
    permissions:
      id-token: write
    steps: [{run: "true"}]
"""
    )
    assert workflow.permissions == "read-all"
    assert workflow.job.permissions == {"id-token": "write"}
    assert grant_of(workflow.permissions, workflow.job.permissions).granted


class Recorder:
    def __init__(self) -> None:
        self.masked: list[str] = []
        self.lines: list[str] = []
        self.calls: list[tuple[str, str, str]] = []
        self.fail: str | None = None

    def fetch(self, endpoint: str, spiffe_id: str, audience: str, timeout_s: float) -> str:
        self.calls.append((endpoint, spiffe_id, audience))
        if self.fail:
            raise IdTokenError(self.fail)
        return f"header.{audience}.signature"


@pytest.fixture
async def served() -> AsyncIterator[tuple[IdTokenEndpoint, Recorder]]:
    recorder = Recorder()
    endpoint = IdTokenEndpoint(
        JOB_ID, "unix:///run/agent.sock", recorder.masked.append, recorder.lines.append, fetch=recorder.fetch
    )
    await endpoint.start()
    try:
        yield endpoint, recorder
    finally:
        await endpoint.aclose()


def _get(url: str, bearer: str | None, method: str = "GET") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, method=method)
    if bearer is not None:
        request.add_header("Authorization", f"Bearer {bearer}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def _ask(url: str, bearer: str | None, method: str = "GET") -> tuple[int, dict[str, Any]]:
    import asyncio

    return await asyncio.to_thread(_get, url, bearer, method)


async def test_issues_a_token_for_the_audience(served: tuple[IdTokenEndpoint, Recorder]) -> None:
    endpoint, recorder = served
    env = endpoint.env()
    assert env["ACTIONS_ID_TOKEN_REQUEST_URL"].startswith("http://127.0.0.1:")
    assert "?" in env["ACTIONS_ID_TOKEN_REQUEST_URL"]  # @actions/core appends `&audience=`
    assert recorder.masked == [endpoint.bearer] and len(endpoint.bearer) >= 40
    status, body = await _ask(f"{endpoint.url}&audience=sts.example", endpoint.bearer)
    assert (status, body) == (200, {"value": "header.sts.example.signature"})
    assert recorder.calls == [("unix:///run/agent.sock", JOB_ID, "sts.example")]
    assert recorder.masked[-1] == "header.sts.example.signature"  # masked before it left
    assert recorder.lines == [f"Issued an OIDC ID token (JWT-SVID for {JOB_ID}) for audience 'sts.example'"]
    assert (endpoint.counts.issued, endpoint.counts.refused) == (1, 0)


async def test_audience_is_url_decoded(served: tuple[IdTokenEndpoint, Recorder]) -> None:
    endpoint, recorder = served
    status, _ = await _ask(f"{endpoint.url}&audience=https%3A%2F%2Fvault.example%3A8200", endpoint.bearer)
    assert status == 200
    assert recorder.calls[0][2] == "https://vault.example:8200"


@pytest.mark.parametrize(
    ("suffix", "bearer", "status", "message"),
    [
        ("&audience=x", None, 401, "the request has no `Authorization: Bearer`"),
        ("&audience=x", "someone-elses", 401, "the bearer is not this job's ACTIONS_ID_TOKEN_REQUEST_TOKEN"),
        ("", "OWN", 400, "the request names no audience"),
        ("&audience=", "OWN", 400, "the request names no audience"),
        ("&audience=a&audience=b", "OWN", 400, "or more than one"),
        ("&audience=a%0Ab", "OWN", 400, "printable characters"),
    ],
)
async def test_refusals(
    served: tuple[IdTokenEndpoint, Recorder], suffix: str, bearer: str | None, status: int, message: str
) -> None:
    endpoint, recorder = served
    got, body = await _ask(endpoint.url + suffix, endpoint.bearer if bearer == "OWN" else bearer)
    assert got == status
    assert message in body["message"]
    assert recorder.calls == []
    assert endpoint.counts.refused == 1


async def test_other_paths_and_methods(served: tuple[IdTokenEndpoint, Recorder]) -> None:
    endpoint, _ = served
    base = endpoint.url.split("/_dynrunner")[0]
    assert (await _ask(f"{base}/other?audience=x", endpoint.bearer))[0] == 404
    assert (await _ask(f"{endpoint.url}&audience=x", endpoint.bearer, method="POST"))[0] == 405


async def test_workload_api_refusal_is_a_502_with_the_reason(served: tuple[IdTokenEndpoint, Recorder]) -> None:
    endpoint, recorder = served
    recorder.fail = "no identity issued"
    status, body = await _ask(f"{endpoint.url}&audience=sts.example", endpoint.bearer)
    assert status == 502
    assert body["message"] == (
        f"the Workload API issued no JWT-SVID for {JOB_ID} (audience 'sts.example'): no identity issued"
    )
    assert recorder.masked == [endpoint.bearer]


async def test_every_job_gets_its_own_bearer() -> None:
    first = IdTokenEndpoint(JOB_ID, "unix:///s", lambda _: None, lambda _: None)
    second = IdTokenEndpoint(JOB_ID, "unix:///s", lambda _: None, lambda _: None)
    assert first.bearer != second.bearer
