"""One request suite against the real opensandbox-server 1.1.1 app (its routes, models,
validators and auth, with the double's engine as the runtime: see serve_real.py) and against
the double's own HTTP layer. Every answer must agree in status code and error shape, and the
SDK's own requests, and the `opensandbox` backend's, must be accepted by the real server's
schema."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from opensandbox import SandboxManager
from opensandbox.adapters.factory import AdapterFactory
from opensandbox.config import ConnectionConfig
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule, SandboxFilter, SandboxImageSpec
from opensandbox.transport import RetryPolicy

from dynrunner.controller import contract
from dynrunner.controller.backends.opensandbox import builders
from dynrunner.controller.backends.opensandbox.api import OpenSandboxApi
from dynrunner.controller.backends.opensandbox.builders import VmSettings
from dynrunner.controller.backends.opensandbox.config import OpenSandboxBackendConfig
from dynrunner.doubles.opensandbox import OpenSandboxDouble
from tests.fixtures.opensandbox import shell_image
from tests.fixtures.opensandbox_backend import vm_assignment

SERVE_REAL = Path(__file__).with_name("serve_real.py")
SLEEPER = "registry.test/sleeper:1"
"""The image serve_real.py's runtime boots."""
IMAGE = "registry.test/dynrunner-vm:1"
VALID: dict[str, Any] = {"image": {"uri": IMAGE}, "entrypoint": ["/entry"], "resourceLimits": {"cpu": "1"}}
SOON = (datetime.now(UTC) + timedelta(days=1)).isoformat()

Target = tuple[str, str]  # (url, api key)


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    state = tmp_path_factory.mktemp("real-opensandbox")
    process = subprocess.Popen(
        [sys.executable, str(SERVE_REAL), str(state)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            pytest.fail(f"the real opensandbox-server did not start (exit {process.wait()})")
        started = json.loads(line)
        yield started["url"], started["api_key"]
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture
async def double_server(tmp_path: Path) -> AsyncIterator[Target]:
    async with OpenSandboxDouble.start(
        tmp_path / "double", runtime="kubernetes", api_key="contract-key", max_timeout_s=86400
    ) as osb:
        yield osb.url, osb.api_key


@pytest.fixture
def both(real_server: Target, double_server: Target) -> list[Target]:
    return [real_server, double_server]


def _shape(answer: httpx.Response) -> Any:
    """What must agree: the status, and the error's shape (envelope code, or 422 locations and types)."""
    if answer.status_code < 300 or not answer.content:
        return answer.status_code
    body = answer.json()
    if answer.status_code == 422:
        return 422, [(tuple(item["loc"]), item["type"]) for item in body["detail"]]
    if set(body) == {"detail"}:
        return answer.status_code, "detail", body["detail"]
    return answer.status_code, sorted(body), body.get("code")


async def _each(targets: list[Target], method: str, path: str, **kwargs: Any) -> list[httpx.Response]:
    answers = []
    for url, key in targets:
        headers = {"OPEN-SANDBOX-API-KEY": key, **kwargs.pop("headers", {})} if "no_key" not in kwargs else {}
        # generous: the real server answers slowly on a loaded machine (httpx waits 5 s by default)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
            answers.append(await client.request(method, path, **{k: v for k, v in kwargs.items() if k != "no_key"}))
    return answers


CREATE_CASES = {
    "valid": VALID,
    "no entrypoint": {**VALID, "entrypoint": None},
    "empty entrypoint": {**VALID, "entrypoint": []},
    "short timeout": {**VALID, "timeout": 59},
    "timeout not a number": {**VALID, "timeout": "soon"},
    "timeout above the cap": {**VALID, "timeout": 86401},
    "no resource limits": {**VALID, "resourceLimits": None},
    "image and snapshot": {**VALID, "snapshotId": "s"},
    "neither image nor snapshot": {**VALID, "image": None},
    "image without uri": {**VALID, "image": {}},
    "template with env": {"templateId": "t", "env": {"A": "1"}, "timeout": 60},
    "template without timeout": {"templateId": "t"},
    "reserved env": {**VALID, "env": {"OPENSANDBOX_LIFECYCLE": "x"}},
    "env null value": {**VALID, "env": {"A": None}},
    "bad metadata key": {**VALID, "metadata": {"a b": "1"}},
    "bad metadata value": {**VALID, "metadata": {"k": "a/b"}},
    "reserved metadata": {**VALID, "metadata": {"opensandbox.io/id": "1"}},
    "long metadata value": {**VALID, "metadata": {"k": "v" * 64}},
    "prefixed metadata key": {**VALID, "metadata": {"dynrunner.io/pool": "vm"}},
    "network policy": {
        **VALID,
        "networkPolicy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "gitea.example"}]},
    },
    "empty egress target": {**VALID, "networkPolicy": {"egress": [{"action": "allow", "target": ""}]}},
    "credential proxy without policy": {**VALID, "credentialProxy": {"enabled": True}},
    "unknown field": {**VALID, "colour": "blue"},
    "not an object": [1, 2],
}


@pytest.mark.parametrize("case", sorted(CREATE_CASES))
async def test_create_answers_agree(both: list[Target], case: str) -> None:
    body = CREATE_CASES[case]
    if isinstance(body, dict):
        body = {key: value for key, value in body.items() if value is not None}
    real, double = await _each(both, "POST", "/v1/sandboxes", json=body)
    assert _shape(double) == _shape(real), (real.text, double.text)
    if real.status_code == 202:
        assert set(double.json()) == set(real.json())


async def test_lifecycle_answers_agree(both: list[Target]) -> None:
    created = await _each(both, "POST", "/sandboxes", json={**VALID, "timeout": 120, "metadata": {"job": "7"}})
    ids = [answer.json()["id"] for answer in created]
    steps: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/v1/sandboxes/{id}", {}),
        ("GET", "/v1/sandboxes", {"params": {"metadata": "job=7"}}),
        ("GET", "/v1/sandboxes", {"params": {"metadata": "job=7&broken"}}),
        ("GET", "/v1/sandboxes", {"params": {"state": ["Pending", "running"], "pageSize": 1}}),
        ("GET", "/v1/sandboxes", {"params": {"page": 0}}),
        ("GET", "/v1/sandboxes", {"params": {"pageSize": 500}}),
        ("GET", "/v1/sandboxes/{id}/endpoints/44772", {}),
        ("GET", "/v1/sandboxes/{id}/endpoints/0", {}),
        ("GET", "/v1/sandboxes/{id}/endpoints/http", {}),
        ("POST", "/v1/sandboxes/{id}/renew-expiration", {"json": {"expiresAt": SOON}}),
        ("POST", "/v1/sandboxes/{id}/renew-expiration", {"json": {"expiresAt": "2020-01-01T00:00:00Z"}}),
        ("POST", "/v1/sandboxes/{id}/renew-expiration", {"json": {"expiresAt": "tomorrow"}}),
        ("POST", "/v1/sandboxes/{id}/renew-expiration", {"json": {}}),
        ("PATCH", "/v1/sandboxes/{id}/metadata", {"json": {"job": None, "pool": "vm"}}),
        ("PATCH", "/v1/sandboxes/{id}/metadata", {"json": {"opensandbox.io/x": "1"}}),
        ("PATCH", "/v1/sandboxes/{id}/metadata", {"json": {"k": "a b"}}),
        ("POST", "/v1/sandboxes/{id}/pause", {}),
        ("POST", "/v1/sandboxes/{id}/resume", {}),
        ("GET", "/v1/sandboxes/missing", {}),
        ("DELETE", "/v1/sandboxes/missing", {}),
        ("POST", "/v1/sandboxes/missing/renew-expiration", {"json": {"expiresAt": SOON}}),
        ("GET", "/v1/sandboxes", {"no_key": True}),
        ("GET", "/v1/sandboxes", {"headers": {"OPEN-SANDBOX-API-KEY": "wrong"}}),
        ("GET", "/health", {"no_key": True}),
        ("GET", "/v1/nothing-here", {}),
        ("DELETE", "/v1/sandboxes/{id}", {}),
        ("GET", "/v1/sandboxes/{id}", {}),
    ]
    for method, path, kwargs in steps:
        answers = []
        for target, sandbox_id in zip(both, ids, strict=True):
            (answer,) = await _each([target], method, path.format(id=sandbox_id), **dict(kwargs))
            answers.append(answer)
        real, double = answers
        assert _shape(double) == _shape(real), (method, path, kwargs, real.text, double.text)
        if real.status_code == 200 and real.headers.get("content-type") == "application/json":
            assert _keys(double.json()) == _keys(real.json()), (method, path)


def _keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _keys(item) for key, item in value.items() if key not in {"metadata", "headers"}}
    if isinstance(value, list):
        return [_keys(item) for item in value[:1]]
    return type(value).__name__


def _config(target: Target) -> ConnectionConfig:
    url, key = target
    return ConnectionConfig(
        domain=url,
        api_key=key,
        headers={"OPEN-SANDBOX-CLIENT-IP": "127.0.0.1"},
        disable_metrics=True,
        retry_policy=RetryPolicy.disabled(),
    )


async def test_the_sdks_requests_fit_the_real_schema_and_get_the_same_answers(both: list[Target]) -> None:
    """The calls a backend makes through the SDK: create (all the options it will use), list
    by metadata, get, renew, kill; the real server must accept every one."""
    results = []
    for target in both:
        config = _config(target).with_transport_if_missing()
        service = AdapterFactory(config).create_sandbox_service()
        created = await service.create_sandbox(
            spec=SandboxImageSpec(image=IMAGE),
            entrypoint=["/usr/local/bin/dynrunner-vm-entrypoint"],
            env={"DYNRUNNER_EXECUTOR_UID": "1001"},
            metadata={"dynrunner-assignment-id": "a1b2", "dynrunner-task-id": "42", "dynrunner-pool": "vm"},
            timeout=timedelta(hours=3, minutes=10),
            resource={"cpu": "2", "memory": "4Gi"},
            network_policy=NetworkPolicy(
                default_action="deny", egress=[NetworkRule(action="allow", target="gitea.example.org")]
            ),
            credential_proxy=None,
            extensions={},
            volumes=None,
            platform=None,
            secure_access=False,
            snapshot_id=None,
            resource_requests=None,
            lifecycle=None,
        )
        manager = await SandboxManager.create(connection_config=config)
        listed = await manager.list_sandbox_infos(SandboxFilter(metadata={"dynrunner-assignment-id": "a1b2"}))
        info = await manager.get_sandbox_info(created.id)
        renewed = await manager.renew_sandbox(created.id, timedelta(minutes=30))
        await manager.kill_sandbox(created.id)
        after = await manager.list_sandbox_infos(SandboxFilter(metadata={"dynrunner-assignment-id": "a1b2"}))
        await manager.close()
        await config.close_transport_if_owned()
        results.append(
            (
                [item.id for item in listed.sandbox_infos] == [created.id],
                info.status.state,
                info.metadata,
                renewed.expires_at > datetime.now(UTC),
                after.sandbox_infos,
            )
        )
    assert results[0] == results[1]
    assert results[0][0] is True


async def test_the_backends_requests_fit_the_real_schema(real_server: Target, tmp_path: Path) -> None:
    """What the `opensandbox` backend sends (its builders through its API module): the create
    of a job's VM with every option a pool can set, the metadata filter, the stage patch, a
    renewal to a time it computed, the delete; the real server accepts each, and the labels
    come back as the backend reads them."""
    url, key = real_server
    key_file = tmp_path / "key"
    key_file.write_text(key)
    pool = OpenSandboxBackendConfig(
        url=url,
        api_key_file=key_file,
        image=IMAGE,
        env={"SPIRE_SERVER_ADDRESS": "spire.example.org", "SPIRE_SERVER_PORT": "8081"},
        resources={"cpu": "2", "memory": "4Gi"},
        resource_requests={"cpu": "1"},
        network_policy={"egress": [{"target": "gitea.example.org"}, {"target": "*.pypi.org"}]},
        timeout_s=600,
    )
    settings = VmSettings(pool="vm", backend=pool, trust_domain="example.org")
    now = datetime.now(UTC)
    assignment = vm_assignment(deadline=now + timedelta(hours=3))
    api = OpenSandboxApi.connect(url, api_key_file=key_file, headers={"OPEN-SANDBOX-CLIENT-IP": "127.0.0.1"})
    try:
        sandbox_id = await api.create(builders.sandbox_request(assignment, settings, now=now, stream_seq=12))
        aid_key = builders.metadata_key("dynrunner.io/assignment-id")
        [listed] = await api.list({aid_key: assignment.assignment_id})
        assert listed.id == sandbox_id and listed.expires_at is not None
        assert builders.labels_of(listed.metadata) == contract.environment_labels(assignment, 12)
        assert builders.deadline_of(listed.metadata) == assignment.deadline.replace(microsecond=0)  # type: ignore[union-attr]
        staged = await api.patch_metadata(sandbox_id, {builders.KEY_STAGE: builders.STAGE_STAGED})
        assert builders.stage_of(staged.metadata) == builders.STAGE_STAGED
        target = builders.expires_at(assignment.deadline, pool, datetime.now(UTC))
        assert abs((await api.renew(sandbox_id, target) - target).total_seconds()) < 1
        assert await api.delete(sandbox_id) is True
        assert await api.delete(sandbox_id) is False
        assert await api.list({aid_key: assignment.assignment_id}) == []
    finally:
        await api.aclose()


async def _running(target: Target, sandbox_id: str) -> httpx.Response:
    """The execd endpoint of a sandbox, once it is published (the sandbox runs)."""
    url, key = target
    async with httpx.AsyncClient(base_url=url, headers={"OPEN-SANDBOX-API-KEY": key}) as client:
        for _ in range(300):
            answer = await client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/44772")
            if answer.status_code == 200:
                return answer
            await asyncio.sleep(0.1)
    pytest.fail(f"sandbox {sandbox_id} did not run: {answer.text}")


async def test_the_proxy_route_refuses_a_secured_sandboxs_caller_without_its_token(
    real_server: Target, tmp_path: Path
) -> None:
    """The real server's proxy route takes no API key (single-tenant auth exempts it); for a
    sandbox made with `secureAccess` it demands the sandbox's own token from the endpoint's
    headers: a caller with only the id, a guessed token, or only the API key is refused, by the
    real server's code and by the double alike."""
    async with OpenSandboxDouble.start(
        tmp_path / "double",
        runtime="kubernetes",
        gateway=True,
        api_key="contract-key",
        images={SLEEPER: shell_image()},
    ) as osb:
        both = [real_server, (osb.url, osb.api_key)]
        body = {
            **VALID,
            "image": {"uri": SLEEPER},
            "entrypoint": ["sleep", "600"],
            "timeout": 120,
            "secureAccess": True,
        }
        created = await _each(both, "POST", "/v1/sandboxes", json=body)
        ids = [answer.json()["id"] for answer in created]
        for target, sandbox_id in zip(both, ids, strict=True):
            endpoint = await _running(target, sandbox_id)
            assert endpoint.json()["headers"]["OpenSandbox-Secure-Access"]
        for headers in ({}, {"OpenSandbox-Secure-Access": "guessed"}, {"OPEN-SANDBOX-API-KEY": "contract-key"}):
            answers = []
            for (url, _key), sandbox_id in zip(both, ids, strict=True):
                async with httpx.AsyncClient(base_url=url, headers=headers) as client:
                    answers.append(
                        await client.get(
                            f"/v1/sandboxes/{sandbox_id}/proxy/44772/files/download", params={"path": "/etc/hostname"}
                        )
                    )
            real, double = answers
            assert real.status_code == 401, (headers, real.text)
            assert _shape(double) == _shape(real), (headers, real.text, double.text)
        await _each(both[:1], "DELETE", f"/v1/sandboxes/{ids[0]}")


async def test_the_console_the_backend_reads_is_the_real_diagnostics_route(both: list[Target], tmp_path: Path) -> None:
    """`api.console` (a VM that did not start: its console's last lines go to the job log) asks
    the server's stable diagnostics logs route, which both answer alike, scopes refused alike."""
    said = []
    for url, key in both:
        (created,) = await _each([(url, key)], "POST", "/v1/sandboxes", json={**VALID, "timeout": 120})
        sandbox_id = created.json()["id"]
        key_file = tmp_path / "key"
        key_file.write_text(key)
        api = OpenSandboxApi.connect(url, api_key_file=key_file, headers={"OPEN-SANDBOX-CLIENT-IP": "127.0.0.1"})
        try:
            said.append(await api.console(sandbox_id))
        finally:
            await api.aclose()
        (wrong,) = await _each([(url, key)], "GET", f"/v1/sandboxes/{sandbox_id}/diagnostics/logs?scope=kernel")
        said.append(_shape(wrong))
        await _each([(url, key)], "DELETE", f"/v1/sandboxes/{sandbox_id}")
    assert said[0] == said[2] == "" and said[1] == said[3] == (
        400,
        ["code", "message"],
        "DIAGNOSTICS_SCOPE_UNSUPPORTED",
    )
