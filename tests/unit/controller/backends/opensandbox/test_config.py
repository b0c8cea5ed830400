"""`pools[].backend` of kind opensandbox and `identity.spireServer`: what is refused at start,
with the key that is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dynrunner.controller.backends.opensandbox.config import OpenSandboxBackendConfig
from dynrunner.controller.config.model import ConfigError, load_config


def _load(
    tmp_path: Path, backend: dict[str, Any], identity: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> Any:
    (tmp_path / "token").write_text("reg-token\n")
    (tmp_path / "osb.key").write_text("k\n")
    data: dict[str, Any] = {
        "gitea": {"url": "https://gitea.example.com", "registrationTokenFile": "token"},
        "pools": [{"name": "vm", "labels": ["self-hosted", "vm"], "backend": {"kind": "opensandbox", **backend}}],
    }
    if identity is not None:
        data["identity"] = identity
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path, {"HOME": str(tmp_path), **(env or {})})


def _problems(tmp_path: Path, backend: dict[str, Any], identity: dict[str, Any] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, backend, identity)
    return "\n".join(info.value.problems)


BASE = {"url": "https://osb.example.org/", "apiKeyFile": "osb.key", "image": "reg/dynrunner-vm:1", "identity": False}


def test_a_pool_of_vms_with_its_defaults(tmp_path: Path) -> None:
    cfg = _load(tmp_path, BASE)
    backend = cfg.pools[0].backend
    assert isinstance(backend, OpenSandboxBackendConfig)
    assert backend.url == "https://osb.example.org"
    assert backend.api_key_file == tmp_path / "osb.key"
    assert backend.entrypoint == ["/usr/local/bin/dynrunner-vm-entrypoint"]
    assert (backend.timeout_s, backend.lease_s, backend.start_timeout_s) == (600, 1200, 600)
    assert backend.resources == {"cpu": "2", "memory": "4Gi"}
    assert backend.workspace == "/home/runner/work" and backend.executor_uid == 1001


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"image": ""}, "set one of image"),
        ({"templateId": "tpl-1"}, "set one of image"),
        ({"image": "", "templateId": "tpl-1", "env": {"A": "b"}}, "env cannot be set with templateId"),
        ({"url": "ftp://osb"}, "http:// or https://"),
        ({"url": "https://user:pw@osb"}, "must not carry credentials"),
        ({"env": {"OPENSANDBOX_LIFECYCLE": "x"}}, "reserved by OpenSandbox"),
        ({"env": {"1BAD": "x"}}, "not an environment variable name"),
        ({"networkPolicy": {"egress": [{"target": "10.0.0.0/8"}]}}, "host name or *.domain"),
        ({"resources": {}}, "resources (cpu, memory) are required"),
        ({"leaseSeconds": 60}, "leaseSeconds: must be ≥ 120"),
        ({"workloadApiSocket": "relative.sock"}, "absolute path"),
        ({"workspace": "/"}, "absolute path below /"),
        ({"bogus": 1}, "backend.bogus: unknown key"),
    ],
)
def test_refused_settings_name_their_key(tmp_path: Path, change: dict[str, Any], expected: str) -> None:
    assert expected in _problems(tmp_path, {**BASE, **change})


def test_a_template_needs_no_image_and_resources_go_unsent(tmp_path: Path) -> None:
    backend = _load(tmp_path, {**BASE, "image": "", "templateId": "tpl-1"}).pools[0].backend
    assert backend.template_id == "tpl-1"


def test_vms_with_identity_need_the_spire_server(tmp_path: Path) -> None:
    assert "identity.spireServer must say" in _problems(tmp_path, {**BASE, "identity": True})
    cfg = _load(tmp_path, {**BASE, "identity": True}, {"spireServer": {"socketPath": "/run/spire/api.sock"}})
    assert cfg.identity.spire_server.socket_path == Path("/run/spire/api.sock")
    assert cfg.identity.spire_server.join_token_ttl_s == 900
    by_env = {"DYNRUNNER_IDENTITY_SPIRE_SERVER_SOCKET_PATH": "/run/spire/admin.sock"}
    cfg = _load(tmp_path, {**BASE, "identity": True}, env=by_env)
    assert cfg.identity.spire_server.socket_path == Path("/run/spire/admin.sock")


@pytest.mark.parametrize(
    ("spire", "expected"),
    [
        ({}, "set one of socketPath"),
        ({"socketPath": "/s.sock", "address": "spire:8081"}, "set one of socketPath"),
        ({"address": "spire:8081"}, "address needs certFile, keyFile, bundleFile"),
        ({"address": "spire", "certFile": "c", "keyFile": "k", "bundleFile": "b"}, "host:port"),
        ({"socketPath": "/s.sock", "certFile": "c"}, "certFile and keyFile are for address"),
        ({"socketPath": "/s.sock", "joinTokenTtlSeconds": 10}, "joinTokenTtlSeconds: must be ≥ 60"),
    ],
)
def test_the_spire_server_is_reached_one_way(tmp_path: Path, spire: dict[str, Any], expected: str) -> None:
    assert expected in _problems(tmp_path, {**BASE, "identity": True}, {"spireServer": spire})
