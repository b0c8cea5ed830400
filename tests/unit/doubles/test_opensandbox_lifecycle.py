"""The OpenSandbox double's lifecycle API, driven by the official SDK through respx (no socket)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import SandboxFilter

from dynrunner.doubles.opensandbox import CreateFailure, OpenSandboxDouble
from tests.fixtures.opensandbox import SHELL_IMAGE, sdk_config

SLEEPER = ["sh", "-c", "exec sleep 600"]


async def _manager(osb: OpenSandboxDouble) -> SandboxManager:
    return await SandboxManager.create(connection_config=sdk_config(osb))


async def _create(osb: OpenSandboxDouble, **kwargs: object) -> Sandbox:
    kwargs.setdefault("entrypoint", SLEEPER)
    kwargs.setdefault("timeout", timedelta(minutes=5))
    return await Sandbox.create(SHELL_IMAGE, connection_config=sdk_config(osb), **kwargs)  # type: ignore[arg-type]


def _raw(osb: OpenSandboxDouble) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=osb.url, headers={"OPEN-SANDBOX-API-KEY": osb.api_key})


VALID = {"image": {"uri": SHELL_IMAGE}, "entrypoint": ["true"], "resourceLimits": {"cpu": "1"}}


async def test_create_sends_camel_case_and_answers_202_running(opensandbox_routed: OpenSandboxDouble) -> None:
    osb = opensandbox_routed
    sandbox = await _create(osb, env={"SECRET": "s3"}, metadata={"dynrunner-assignment-id": "42"})
    create = next(call for call in osb.router.calls if call.request.method == "POST")  # type: ignore[attr-defined]
    body = json.loads(create.request.content)
    assert create.response.status_code == 202
    assert body["image"] == {"uri": SHELL_IMAGE}
    assert body["resourceLimits"] == {"cpu": "1", "memory": "2Gi"}
    assert body["timeout"] == 300

    manager = await _manager(osb)
    info = await manager.get_sandbox_info(sandbox.id)
    assert info.status.state == "Running"
    assert info.metadata == {"dynrunner-assignment-id": "42"}
    assert info.expires_at is not None
    async with _raw(osb) as client:
        created = (await client.post("/v1/sandboxes", json={**VALID, "env": {"SECRET": "s3"}})).json()
        got = (await client.get(f"/v1/sandboxes/{sandbox.id}")).json()
    assert created["status"]["state"] == "Running"
    assert "image" not in created and "env" not in created
    assert got["image"] == {"uri": SHELL_IMAGE} and "env" not in got
    await manager.close()
    await sandbox.close()


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"entrypoint": None}, ["body"]),
        ({"timeout": 30}, ["body", "timeout"]),
        ({"entrypoint": []}, ["body", "entrypoint"]),
        ({"resourceLimits": None}, ["body"]),
        ({"templateId": "t", "timeout": 60}, ["body"]),
    ],
)
async def test_a_body_the_contract_rejects_gets_fastapis_422(
    opensandbox_routed: OpenSandboxDouble, change: dict[str, object], loc: list[str]
) -> None:
    body = {key: value for key, value in {**VALID, **change}.items() if value is not None}
    async with _raw(opensandbox_routed) as client:
        answer = await client.post("/v1/sandboxes", json=body)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == loc
    assert opensandbox_routed.listed() == []


@pytest.mark.parametrize(
    "metadata", [{"opensandbox.io/id": "x"}, {"a b": "1"}, {"k": "a b/c"}, {"k": "x" * 64}, {"-k": "1"}]
)
async def test_metadata_breaking_label_rules_is_a_400_envelope(
    opensandbox_routed: OpenSandboxDouble, metadata: dict[str, str]
) -> None:
    async with _raw(opensandbox_routed) as client:
        answer = await client.post("/v1/sandboxes", json={**VALID, "metadata": metadata})
    assert answer.status_code == 400
    assert answer.json()["code"] == "SANDBOX::INVALID_METADATA_LABEL"
    assert set(answer.json()) == {"code", "message"}


async def test_list_filters_on_metadata_as_the_server_decodes_it(opensandbox_routed: OpenSandboxDouble) -> None:
    osb = opensandbox_routed
    mine = await _create(osb, metadata={"dynrunner-assignment-id": "42", "dynrunner-pool": "vm"})
    await _create(osb, metadata={"dynrunner-assignment-id": "43", "dynrunner-pool": "vm"})
    manager = await _manager(osb)
    page = await manager.list_sandbox_infos(SandboxFilter(metadata={"dynrunner-assignment-id": "42"}))
    assert [info.id for info in page.sandbox_infos] == [mine.id]
    query = osb.router.calls[-1].request.url.query.decode()  # type: ignore[attr-defined]
    assert query == "metadata=dynrunner-assignment-id%3D42"
    both = await manager.list_sandbox_infos(SandboxFilter(metadata={"dynrunner-pool": "vm"}, states=["Running"]))
    assert len(both.sandbox_infos) == 2
    none = await manager.list_sandbox_infos(SandboxFilter(states=["Paused"]))
    assert none.sandbox_infos == []
    async with _raw(osb) as client:
        malformed = await client.get("/v1/sandboxes", params={"metadata": "a=1&broken"})
        paged = await client.get("/v1/sandboxes", params={"pageSize": 1, "page": 2})
        too_big = await client.get("/v1/sandboxes", params={"pageSize": 201})
    assert malformed.status_code == 400 and malformed.json()["code"] == "INVALID_METADATA_FORMAT"
    assert paged.json()["pagination"] == {
        "page": 2,
        "pageSize": 1,
        "totalItems": 2,
        "totalPages": 2,
        "hasNextPage": False,
    }
    assert too_big.status_code == 422
    await manager.close()


async def test_api_key_is_required_except_on_health(opensandbox_routed: OpenSandboxDouble) -> None:
    async with httpx.AsyncClient(base_url=opensandbox_routed.url) as client:
        missing = await client.get("/v1/sandboxes")
        wrong = await client.get("/v1/sandboxes", headers={"OPEN-SANDBOX-API-KEY": "nope"})
        health = await client.get("/health")
    assert (missing.status_code, missing.json()["code"]) == (401, "MISSING_API_KEY")
    assert (wrong.status_code, wrong.json()["code"]) == (401, "INVALID_API_KEY")
    assert health.json() == {"status": "healthy"}


async def test_delete_is_204_then_the_sandbox_is_gone_and_its_process_killed(
    opensandbox_routed: OpenSandboxDouble,
) -> None:
    osb = opensandbox_routed
    sandbox = await _create(osb)
    process = osb.sandbox(sandbox.id).process
    assert process is not None
    manager = await _manager(osb)
    await manager.kill_sandbox(sandbox.id)
    assert osb.router.calls[-1].response.status_code == 204  # type: ignore[attr-defined]
    assert process.returncode is not None
    with pytest.raises(SandboxApiException) as missing:
        await manager.get_sandbox_info(sandbox.id)
    assert missing.value.status_code == 404
    with pytest.raises(SandboxApiException) as again:
        await manager.kill_sandbox(sandbox.id)
    assert again.value.status_code == 404
    await manager.close()


async def test_renew_sets_an_absolute_future_time_and_expiry_removes_the_sandbox(
    opensandbox_routed: OpenSandboxDouble,
) -> None:
    osb = opensandbox_routed
    sandbox = await _create(osb, timeout=timedelta(seconds=60))
    manager = await _manager(osb)
    renewed = await manager.renew_sandbox(sandbox.id, timedelta(minutes=30))
    assert renewed.expires_at > datetime.now(UTC) + timedelta(minutes=29)
    assert await osb.advance(25 * 60) == []
    process = osb.sandbox(sandbox.id).process
    assert await osb.advance(6 * 60) == [sandbox.id]
    assert process is not None and process.returncode is not None
    with pytest.raises(SandboxApiException) as gone:
        await manager.get_sandbox_info(sandbox.id)
    assert gone.value.status_code == 404
    await manager.close()


async def test_renew_refuses_the_past_and_sandboxes_without_expiry(opensandbox_routed: OpenSandboxDouble) -> None:
    osb = opensandbox_routed
    timed = await _create(osb)
    forever = await _create(osb, timeout=None)
    async with _raw(osb) as client:
        past = await client.post(
            f"/v1/sandboxes/{timed.id}/renew-expiration", json={"expiresAt": "2020-01-01T00:00:00Z"}
        )
        manual = await client.post(
            f"/v1/sandboxes/{forever.id}/renew-expiration",
            json={"expiresAt": (datetime.now(UTC) + timedelta(hours=1)).isoformat()},
        )
        malformed = await client.post(f"/v1/sandboxes/{timed.id}/renew-expiration", json={})
    assert (past.status_code, past.json()["code"]) == (400, "DOCKER::INVALID_EXPIRATION")
    assert (manual.status_code, manual.json()["code"]) == (409, "DOCKER::INVALID_EXPIRATION")
    assert malformed.status_code == 422


async def test_pause_and_resume_walk_the_states_and_refuse_the_wrong_ones(
    opensandbox_routed: OpenSandboxDouble,
) -> None:
    osb = opensandbox_routed
    sandbox = await _create(osb)
    manager = await _manager(osb)
    with pytest.raises(SandboxApiException) as not_paused:
        await manager.resume_sandbox(sandbox.id)
    assert not_paused.value.status_code == 409
    await manager.pause_sandbox(sandbox.id)
    assert (await manager.get_sandbox_info(sandbox.id)).status.state == "Paused"
    with pytest.raises(SandboxApiException) as twice:
        await manager.pause_sandbox(sandbox.id)
    assert twice.value.status_code == 409
    await manager.resume_sandbox(sandbox.id)
    assert (await manager.get_sandbox_info(sandbox.id)).status.state == "Running"
    await manager.close()


@pytest.mark.parametrize(
    ("script", "code", "state", "reason"),
    [
        ("exit 0", 0, "Terminated", "CONTAINER_EXITED"),
        ("exit 3", 3, "Failed", "CONTAINER_EXITED_ERROR"),
        ("kill -9 $$", 137, "Failed", "CONTAINER_EXITED_ERROR"),  # Docker's ExitCode for a signal: 128+N
    ],
)
async def test_the_entrypoints_exit_decides_terminated_or_failed(
    opensandbox_routed: OpenSandboxDouble, script: str, code: int, state: str, reason: str
) -> None:
    osb = opensandbox_routed
    sandbox = await _create(osb, entrypoint=["sh", "-c", script], skip_health_check=True)
    box = await osb.wait_for_state(sandbox.id, "Terminated", "Failed")
    assert (box.status.state, box.status.reason) == (state, reason)
    if code:
        assert box.status.message == f"Sandbox container exited with code {code}."
    manager = await _manager(osb)
    assert [info.id for info in (await manager.list_sandbox_infos(SandboxFilter(states=[state]))).sandbox_infos] == [
        sandbox.id
    ]
    await manager.close()


async def test_injected_create_failures_before_and_after_the_sandbox_exists(
    opensandbox_routed: OpenSandboxDouble,
) -> None:
    osb = opensandbox_routed
    osb.fail_next_create(CreateFailure(status=503, code="SANDBOX::UNAVAILABLE", message="try later"))
    with pytest.raises(SandboxApiException) as refused:
        await _create(osb, metadata={"dynrunner-assignment-id": "7"})
    assert refused.value.status_code == 503
    assert osb.listed() == []
    osb.fail_next_create(CreateFailure(status=504, after_create=True))
    with pytest.raises(SandboxApiException) as lost:
        await _create(osb, metadata={"dynrunner-assignment-id": "7"})
    assert lost.value.status_code == 504
    manager = await _manager(osb)
    found = await manager.list_sandbox_infos(SandboxFilter(metadata={"dynrunner-assignment-id": "7"}))
    assert len(found.sandbox_infos) == 1
    await manager.close()


async def test_unknown_image_fails_the_create_in_the_docker_runtime(opensandbox_routed: OpenSandboxDouble) -> None:
    async with _raw(opensandbox_routed) as client:
        answer = await client.post("/v1/sandboxes", json={**VALID, "image": {"uri": "registry.test/missing:1"}})
    assert (answer.status_code, answer.json()["code"]) == (500, "DOCKER::SANDBOX_IMAGE_PULL_FAILED")
