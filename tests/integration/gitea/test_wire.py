"""Wire fidelity: codecs, compression, both error shapes, paths."""

from __future__ import annotations

import asyncio
import gzip
import json

import pyqwest
import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import (
    AlreadyExists,
    GiteaError,
    Internal,
    LogRow,
    Result,
    RunnerCredentials,
    RunnerRemoved,
    TaskState,
    Unauthenticated,
)
from dynrunner.proto.gitea.client import NO_RETRY
from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.gitea_calls import base_client, final_state, job, now, register, workflow


@pytest.mark.parametrize(
    ("use_json", "gzip_requests"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["proto", "json", "proto+gzip", "json+gzip"],
)
async def test_a_whole_task_in_every_codec(gitea: GiteaDouble, use_json: bool, gzip_requests: bool) -> None:
    runner = await register(gitea, json=use_json, gzip_requests=gzip_requests)
    assert await base_client(gitea, json=use_json, gzip_requests=gzip_requests).ping("codec") == "Hello, codec!"
    gitea.submit("owner/repo", workflow(job("build", steps=40)), secrets={"BIG": "x" * 5000})
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None and fetched.task.context is not None
    assert fetched.task.secrets["BIG"] == "x" * 5000
    assert fetched.task.context["run_id"] == "1"
    assert await runner.update_log(fetched.task.id, 0, [LogRow(now(), "x" * 3000)] * 3, no_more=True) == 3
    result = await runner.update_task(final_state(fetched.task.id, Result.SUCCESS, steps=40), {"k": "v" * 2000})
    assert (result.result, result.sent_outputs) == (Result.SUCCESS, frozenset({"k"}))


async def _post(gitea: GiteaDouble, method: str, body: bytes, headers: dict[str, str]) -> pyqwest.FullResponse:
    return await pyqwest.Client().post(
        f"{gitea.url}/api/actions/runner.v1.RunnerService/{method}",
        headers={"content-type": "application/json", **headers},
        content=body,
    )


async def test_errors_are_connect_unknown_with_grpc_text_and_http_500(gitea: GiteaDouble) -> None:
    response = await _post(gitea, "FetchTask", b"{}", {"x-runner-uuid": "nope", "x-runner-token": "x"})
    assert response.status == 500
    assert json.loads(response.content) == {
        "code": "unknown",
        "message": "rpc error: code = Unauthenticated desc = unregistered runner",
    }


async def test_forgejo_mode_answers_proper_connect_codes(gitea_factory: GiteaFactory) -> None:
    async with gitea_factory(mode="forgejo") as gitea:
        response = await _post(gitea, "FetchTask", b"{}", {"x-runner-uuid": "nope"})
        assert response.status == 401
        assert json.loads(response.content) == {"code": "unauthenticated", "message": "unregistered runner"}
        response = await _post(gitea, "Register", b'{"name": "r", "token": "missing"}', {})
        assert response.status == 400
        assert json.loads(response.content)["code"] == "invalid_argument"


async def test_both_error_shapes_parse_into_the_same_typed_errors(gitea_factory: GiteaFactory) -> None:
    seen = {}
    for mode in ("gitea", "forgejo"):
        async with gitea_factory(mode=mode) as gitea:
            errors: list[GiteaError] = []
            stranger = base_client(gitea).with_credentials(RunnerCredentials("nope", "x"))
            with pytest.raises(Unauthenticated) as unauth:
                await stranger.fetch_task(0)
            errors.append(unauth.value)
            runner = await register(gitea, ephemeral=True)
            intruder = await register(gitea, name="intruder")
            gitea.submit("owner/repo", workflow(job("build")))
            fetched = await runner.fetch_task(0)
            assert fetched.task is not None
            with pytest.raises(Internal) as foreign:
                await intruder.update_log(fetched.task.id, 0, [], retry=NO_RETRY)
            errors.append(foreign.value)
            await runner.update_log(fetched.task.id, 0, [LogRow(now(), "x")], no_more=True)
            with pytest.raises(AlreadyExists) as archived:
                await runner.update_log(fetched.task.id, 1, [LogRow(now(), "y")], retry=NO_RETRY)
            errors.append(archived.value)
            gitea.hooks.pick_pause_s = 0.2
            racing = asyncio.ensure_future(runner.fetch_task(0))
            await asyncio.sleep(0.05)
            await runner.update_task(final_state(fetched.task.id))
            with pytest.raises(RunnerRemoved) as removed:
                await racing
            errors.append(removed.value)
            with pytest.raises(GiteaError) as register_error:
                await base_client(gitea).register(name="", registration_token="x", labels=[])
            errors.append(register_error.value)
            seen[mode] = [(type(e), e.message) for e in errors]
    assert seen["gitea"][:4] == seen["forgejo"][:4]
    assert [m for _, m in seen["gitea"]] == [
        "unregistered runner",
        "invalid runner for task",
        "log file has been archived",
        "pick task: runner has been removed",
        "missing runner token, name",
    ]
    assert seen["gitea"][4][0] is GiteaError and seen["forgejo"][4][0].__name__ == "InvalidArgument"


async def _raw_post(url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """HTTP/1.1 by hand, so nothing decompresses the answer behind our back."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = [f"POST {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}", "connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    await writer.wait_closed()
    header_block, _, payload = raw.partition(b"\r\n\r\n")
    lines = header_block.decode().split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    if fields.get("transfer-encoding") == "chunked":
        chunks, rest = [], payload
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            chunks.append(rest[:size])
            rest = rest[size + 2 :]
        payload = b"".join(chunks)
    return int(lines[0].split()[1]), fields, payload


async def test_small_responses_are_not_compressed_and_large_ones_are(gitea: GiteaDouble) -> None:
    runner = await register(gitea)
    assert runner.credentials is not None
    path = "/api/actions/runner.v1.RunnerService/FetchTask"
    headers = {
        "content-type": "application/json",
        "accept-encoding": "gzip",
        "x-runner-uuid": runner.credentials.uuid,
        "x-runner-token": runner.credentials.token,
    }
    status, fields, body = await _raw_post(gitea.url, path, b"{}", headers)
    assert (status, fields.get("content-encoding")) == (200, None)  # connect-go names no encoding then
    assert json.loads(body) == {"tasksVersion": "1"}
    gitea.submit("owner/repo", workflow(job("build", steps=60)))
    status, fields, body = await _raw_post(gitea.url, path, b"{}", headers)
    assert (status, fields["content-encoding"]) == (200, "gzip")
    task = json.loads(gzip.decompress(body))["task"]
    assert task["id"] == "1" and "workflowPayload" in task


async def test_ping_compresses_even_small_answers(gitea: GiteaDouble) -> None:
    """Gitea builds the PingService handler without `WithCompressMinBytes`."""
    headers = {"content-type": "application/json", "accept-encoding": "gzip"}
    status, fields, body = await _raw_post(gitea.url, "/api/actions/ping.v1.PingService/Ping", b'{"data":"x"}', headers)
    assert (status, fields.get("content-encoding")) == (200, "gzip")
    assert json.loads(gzip.decompress(body)) == {"data": "Hello, x!"}


async def test_gzip_request_bodies_are_accepted(gitea: GiteaDouble) -> None:
    status, _, body = await _raw_post(
        gitea.url,
        "/api/actions/ping.v1.PingService/Ping",
        gzip.compress(b'{"data": "zipped"}'),
        {"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert (status, json.loads(body)) == (200, {"data": "Hello, zipped!"})


async def test_unknown_paths_are_404(gitea: GiteaDouble) -> None:
    client = pyqwest.Client()
    assert (await client.get(f"{gitea.url}/api/v1/version")).status == 404
    response = await client.post(
        f"{gitea.url}/api/actions/runner.v1.RunnerService/Nope", headers={"content-type": "application/proto"}
    )
    assert response.status == 404


async def test_updates_of_a_task_with_unset_fields_are_accepted_in_json(gitea: GiteaDouble) -> None:
    runner = await register(gitea, json=True)
    gitea.submit("owner/repo", workflow(job("build")))
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    assert (await runner.update_task(TaskState(id=fetched.task.id))).result is Result.UNSPECIFIED
