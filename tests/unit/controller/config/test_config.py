"""Configuration: a valid file, every invalid case's message, environment overrides, the
token file, path resolution, and secrets kept out of errors and reprs."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynrunner.controller.config.model import ConfigError, ControllerConfig, env_overrides, load_config
from dynrunner.proto.assignment import ArtifactStoreOptions

TOKEN = "reg-token-Zq81xx"
HOME_ENV = {"HOME": "/home/ci"}


def minimal(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "token").write_text(TOKEN + "\n")
    return {
        "gitea": {"url": "https://gitea.example.com/", "registrationTokenFile": "token"},
        "pools": [{"name": "pod", "labels": ["self-hosted", "pod"]}],
    }


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def load(tmp_path: Path, data: dict[str, Any], env: dict[str, str] | None = None) -> ControllerConfig:
    return load_config(write(tmp_path, data), {**HOME_ENV, **(env or {})})


def problems(tmp_path: Path, data: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, data, env)
    return info.value.problems


def test_minimal_file_gets_documented_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path, minimal(tmp_path))
    assert cfg.gitea.url == "https://gitea.example.com"
    assert cfg.gitea.registration_token() == TOKEN
    assert cfg.gitea.credential_mode == "ephemeral"
    assert (cfg.gitea.request_timeout_s, cfg.gitea.fetch_interval_s, cfg.gitea.fetch_interval_max_s) == (65, 0.5, 1)
    assert cfg.nats.url is None
    assert (cfg.nats.stream, cfg.nats.replicas, cfg.nats.ack_wait_s, cfg.nats.max_deliver) == (
        "DYNRUNNER_ASSIGNMENTS",
        1,
        60,
        5,
    )
    state = Path("/home/ci/.local/state/dynrunner")
    assert cfg.state_dir == state
    assert cfg.nats.data_dir == state / "nats"
    assert cfg.sealing.key_file == state / "sealing.key"
    [pool] = cfg.pools
    assert (pool.name, pool.labels, pool.max_concurrency, pool.job_timeout_minutes) == (
        "pod",
        ["self-hosted", "pod"],
        4,
        180,  # what Gitea enforces (ENDLESS_TASK_TIMEOUT), not GitHub's 360
    )
    assert pool.backend.kind == "local"
    assert pool.backend.root_dir == state / "local" / "pod"
    assert pool.backend.executor_command == ["dynrunner-executor"]
    assert cfg.metrics.address == "127.0.0.1:9464" and cfg.metrics.enabled
    assert cfg.artifacts.options() == ArtifactStoreOptions()
    assert (cfg.logging.level, cfg.logging.json_format) == ("info", True)


def test_full_file(tmp_path: Path) -> None:
    data = minimal(tmp_path)
    data.update(
        {
            "stateDir": "state",
            "nats": {
                "url": "nats://nats-0:4222,nats://nats-1:4222",
                "replicas": 3,
                "ackWaitSeconds": 30,
                "maxDeliver": 7,
                "duplicateWindowSeconds": 600,
                "maxMessageBytes": 1048576,
                "publishTimeoutSeconds": 12.5,
            },
            "pools": [
                {
                    "name": "pod",
                    "labels": ["self-hosted", "pod"],
                    "maxConcurrency": 50,
                    "jobTimeoutMinutes": 90,
                    "backend": {"kind": "local", "rootDir": "/srv/jobs", "executorCommand": ["/opt/x", "--quiet"]},
                },
                {"name": "vm-2", "labels": ["self-hosted", "vm"]},
            ],
            "sealing": {"keyFile": "keys/current.key", "retiredKeyFiles": ["keys/old.key"]},
            "artifacts": {"driver": "S3", "bucket": "ci", "prefix": "art/", "endpoint": "http://minio:9000"},
            "metrics": {"address": ""},
            "executor": {"workspace": "/workspace", "logLevel": "debug", "outputsTotalLimitBytes": 2048},
            "logging": {"level": "warning", "json": False},
        }
    )
    cfg = load(tmp_path, data)
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.nats.replicas == 3 and cfg.nats.ack_wait_s == 30 and cfg.nats.publish_timeout_s == 12.5
    assert cfg.nats.data_dir == tmp_path / "state" / "nats"
    assert cfg.pool("pod").backend.root_dir == Path("/srv/jobs")
    assert cfg.pool("pod").backend.executor_command == ["/opt/x", "--quiet"]
    assert cfg.pool("vm-2").backend.root_dir == tmp_path / "state" / "local" / "vm-2"
    assert cfg.sealing.key_file == tmp_path / "keys" / "current.key"
    assert cfg.sealing.retired_key_files == [tmp_path / "keys" / "old.key"]
    assert cfg.artifacts.options() == ArtifactStoreOptions(
        driver="S3", bucket="ci", prefix="art/", endpoint="http://minio:9000"
    )
    assert not cfg.metrics.enabled
    assert cfg.executor.log_level == "debug" and cfg.executor.outputs_total_limit_bytes == 2048
    assert cfg.logging.json_format is False


def test_inline_token_works_and_never_shows(tmp_path: Path) -> None:
    data = minimal(tmp_path)
    data["gitea"] = {"url": "http://gitea:3000", "registrationToken": TOKEN}
    cfg = load(tmp_path, data)
    assert cfg.gitea.registration_token() == TOKEN
    assert TOKEN not in repr(cfg) and TOKEN not in str(cfg)
    assert TOKEN not in cfg.model_dump_json()


def test_token_file_is_read_once_at_start(tmp_path: Path) -> None:
    cfg = load(tmp_path, minimal(tmp_path))
    (tmp_path / "token").write_text("rotated-later")
    assert cfg.gitea.registration_token() == TOKEN
    assert TOKEN not in repr(cfg)


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = load(tmp_path, minimal(tmp_path))
    with pytest.raises(ValueError, match="frozen"):
        cfg.pools[0].max_concurrency = 9


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    node: Any = data
    keys = dotted.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value


_DELETE = object()

INVALID = [
    ("pools.0.maxConcurrency", 0, "pools[0].maxConcurrency: must be ≥ 1 (got 0)"),
    ("pools.0.maxConcurrency", "many", "pools[0].maxConcurrency: must be an integer (got 'many')"),
    ("pools.0.jobTimeoutMinutes", 0, "pools[0].jobTimeoutMinutes: must be ≥ 1 (got 0)"),
    ("pools.0.name", "Pod_1", "pools[0].name: must be 1-32 characters of lowercase letters, digits and '-'"),
    ("pools.0.labels", [], "pools[0].labels: must have at least 1 item(s)"),
    ("pools.0.labels", ["self hosted"], "pools[0].labels: label 'self hosted' must be 1-255 characters"),
    ("pools.0.labels", ["pod", "pod"], "pools[0].labels: labels must not repeat"),
    (
        "pools.0.labels",
        ["self-hosted", "ubuntu-latest:docker://node:20"],
        "pools[0].labels: label 'ubuntu-latest:docker://node:20' is act_runner's name:docker:... form; "
        "dynrunner registers labels as written and Gitea matches a job's runs-on against names only, so no job "
        "would ever match it. The pool's backend decides where jobs run: write the name alone, 'ubuntu-latest'",
    ),
    ("pools.0.labels", ["self-hosted:host"], "pools[0].labels: label 'self-hosted:host' is act_runner's name:host"),
    ("pools.0.labels", ["vm:LXC:debian:12"], "pools[0].labels: label 'vm:LXC:debian:12' is act_runner's name:LXC:"),
    ("pools.0.backend", {"kind": "firecracker"}, "pools[0].backend: kind 'firecracker' is not a known backend"),
    ("pools.0.backend", {"kind": "opensandbox"}, "pools[0].backend.url: required"),
    ("pools.0.backend", {"rootDir": "/x"}, "pools[0].backend: needs `kind` (one of local, kubernetes, opensandbox)"),
    ("pools.0.backend", {"kind": "kubernetes"}, "pools[0].backend.namespace: required"),
    ("pools.0.backend", {"kind": "local", "executorCommand": []}, "pools[0].backend.executorCommand: must have at"),
    ("pools.0.maxConcurency", 3, "pools[0].maxConcurency: unknown key (did you mean 'maxConcurrency'?)"),
    ("pools", [], "pools: must have at least 1 item(s)"),
    ("pools", _DELETE, "pools: required"),
    ("gitea", _DELETE, "gitea: required"),
    ("gitea.url", "gitea.example.com", "gitea.url: must be an http:// or https:// URL with a host"),
    ("gitea.url", "https://proxy-user:pw-Zx9@gitea.example.com", "gitea.url: must not carry credentials"),
    ("gitea.credentialMode", "global", "gitea.credentialMode: must be one of 'ephemeral' or 'shared'"),
    ("gitea.requestTimeoutSeconds", 30, "gitea.requestTimeoutSeconds: must be ≥ 55 (got 30)"),
    ("gitea.fetchIntervalSeconds", 0, "gitea.fetchIntervalSeconds: must be > 0 (got 0)"),
    ("gitea.fetchIntervalMaxSeconds", 0.25, "gitea: fetchIntervalMaxSeconds must be ≥ fetchIntervalSeconds"),
    ("gitea.registrationTokenFile", "missing", "gitea: registrationTokenFile"),
    ("gitea.registrationTokenFile", _DELETE, "gitea: a registration token is required"),
    ("gitea.registrationToken", "abc", "gitea: set only one of registrationToken and registrationTokenFile"),
    ("nats.url", "http://nats:4222", "nats.url: must be nats://host:port"),
    ("nats.replicas", 7, "nats.replicas: must be ≤ 5 (got 7)"),
    ("nats.maxDeliver", 0, "nats.maxDeliver: must be ≥ 1 (got 0)"),
    ("nats.ackWaitSeconds", 0.5, "nats.ackWaitSeconds: must be ≥ 1 (got 0.5)"),
    ("nats.duplicateWindowSeconds", 60, "nats.duplicateWindowSeconds: must be ≥ 120 (got 60)"),
    ("nats.stream", "has space", "nats.stream: must match"),
    ("artifacts.driver", "Filesystem", "artifacts: driver Filesystem needs `path`"),
    ("artifacts.driver", "S3", "artifacts: driver S3 needs `bucket`"),
    ("artifacts.driver", "GCS", "artifacts.driver: must be one of '', 'Filesystem' or 'S3'"),
    ("metrics.address", "9464", "metrics.address: must be host:port"),
    ("identity.trustDomain", "CI.Example", "identity.trustDomain: must match"),
    ("executor.logLevel", "loud", "executor.logLevel: must be one of 'debug', 'info', 'warning' or 'error'"),
    ("logging.json", "maybe", "logging.json: must be true or false (got 'maybe')"),
    ("surprise", 1, "surprise: unknown key"),
]


@pytest.mark.parametrize(("key", "value", "expected"), INVALID, ids=[f"{k}={v!r}" for k, v, _ in INVALID])
def test_invalid_value_is_named_with_its_key_path(tmp_path: Path, key: str, value: Any, expected: str) -> None:
    data = minimal(tmp_path)
    data["gitea"].setdefault("url", "https://gitea.example.com")
    _set(data, key, value)
    found = problems(tmp_path, data)
    assert any(p.startswith(expected) for p in found), found


def test_a_label_with_a_colon_that_is_no_act_runner_schema_is_a_name(tmp_path: Path) -> None:
    """The Gitea runner reads `pool:a1b2` (an unknown schema) as one opaque name, so may we."""
    data = minimal(tmp_path)
    data["pools"][0]["labels"] = ["self-hosted", "pool:a1b2", "ubuntu:24.04"]
    assert load(tmp_path, data).pools[0].labels == ["self-hosted", "pool:a1b2", "ubuntu:24.04"]


def test_duplicate_pool_names(tmp_path: Path) -> None:
    data = minimal(tmp_path)
    data["pools"].append({"name": "pod", "labels": ["x"]})
    assert problems(tmp_path, data) == ["pools: pool name 'pod' is used twice"]


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    data = minimal(tmp_path)
    data["pools"][0]["maxConcurrency"] = -1
    data["nats"] = {"maxDeliver": 0}
    data["metrics"] = {"address": "nope"}
    found = problems(tmp_path, data)
    assert len(found) == 3, found
    with pytest.raises(ConfigError) as info:
        load(tmp_path, data)
    text = str(info.value)
    assert text.startswith(f"invalid configuration ({tmp_path / 'controller.yaml'}):")
    assert "  - pools[0].maxConcurrency: must be ≥ 1" in text


def test_secrets_are_not_echoed_in_errors(tmp_path: Path) -> None:
    data = minimal(tmp_path)
    data["gitea"] = {"url": "ftp://x", "registrationToken": TOKEN, "registrationTokenFile": "token"}
    data["nats"] = {"url": "http://user:pw-Hq2@nats:4222"}
    data["pools"][0]["maxConcurrency"] = "lots"
    with pytest.raises(ConfigError) as info:
        load(tmp_path, data)
    text = str(info.value)
    assert TOKEN not in text and "pw-Hq2" not in text
    assert "'lots'" in text  # harmless values are echoed


def test_credentials_in_the_gitea_url_are_refused_without_echo(tmp_path: Path) -> None:
    """The Gitea URL reaches every job (GITHUB_SERVER_URL): a proxy password in it would too."""
    data = minimal(tmp_path)
    data["gitea"]["url"] = "https://proxy-user:pw-Zx9@gitea.example.com"
    with pytest.raises(ConfigError) as info:
        load(tmp_path, data)
    assert "gitea.url: must not carry credentials" in str(info.value)
    assert "pw-Zx9" not in str(info.value)


def test_wrong_type_of_token_is_not_echoed(tmp_path: Path) -> None:
    data = minimal(tmp_path)
    data["gitea"] = {"url": "http://x", "registrationToken": ["t0k-in-a-list"]}
    with pytest.raises(ConfigError) as info:
        load(tmp_path, data)
    text = str(info.value)
    assert "gitea.registrationToken: must be a string" in text
    assert "t0k-in-a-list" not in text


def test_empty_token_file(tmp_path: Path) -> None:
    data = minimal(tmp_path)
    (tmp_path / "token").write_text("\n")
    assert problems(tmp_path, data) == [f"gitea: registrationTokenFile {tmp_path / 'token'} is empty"]


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text("gitea:\n  url: [unclosed\npools: []\n")
    with pytest.raises(ConfigError, match=r"line 3, column \d+: invalid YAML"):
        load_config(path, HOME_ENV)


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="the top level must be a mapping of keys, not list"):
        load_config(path, HOME_ENV)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the configuration file: No such file"):
        load_config(tmp_path / "nope.yaml", HOME_ENV)


def test_environment_overrides_yaml(tmp_path: Path) -> None:
    (tmp_path / "other-token").write_text("from-env-file")
    env = {
        "DYNRUNNER_GITEA_URL": "http://gitea.internal:3000",
        "DYNRUNNER_GITEA_REGISTRATION_TOKEN_FILE": str(tmp_path / "other-token"),
        "DYNRUNNER_NATS_URL": "nats://nats:4222",
        "DYNRUNNER_NATS_MAX_DELIVER": "9",
        "DYNRUNNER_METRICS_ADDRESS": "",
        "DYNRUNNER_STATE_DIR": "/var/lib/dynrunner",
        "DYNRUNNER_LOGGING_JSON": "false",
        "DYNRUNNER_ARTIFACTS_DRIVER": "Filesystem",
        "DYNRUNNER_ARTIFACTS_PATH": "/shared/artifacts",
        "DYNRUNNER_UNRELATED": "ignored",
    }
    cfg = load(tmp_path, minimal(tmp_path), env)
    assert cfg.gitea.url == "http://gitea.internal:3000"
    assert cfg.gitea.registration_token() == "from-env-file"
    assert cfg.nats.url == "nats://nats:4222" and cfg.nats.max_deliver == 9
    assert not cfg.metrics.enabled
    assert cfg.state_dir == Path("/var/lib/dynrunner")
    assert cfg.sealing.key_file == Path("/var/lib/dynrunner/sealing.key")
    assert cfg.logging.json_format is False
    assert cfg.artifacts.options().path == "/shared/artifacts"


def test_environment_token_replaces_file_from_yaml(tmp_path: Path) -> None:
    cfg = load(tmp_path, minimal(tmp_path), {"DYNRUNNER_GITEA_REGISTRATION_TOKEN": "env-token"})
    assert cfg.gitea.registration_token() == "env-token"


def test_environment_only_configuration_needs_pools(tmp_path: Path) -> None:
    env = {**HOME_ENV, "DYNRUNNER_GITEA_URL": "http://g", "DYNRUNNER_GITEA_REGISTRATION_TOKEN": "t"}
    with pytest.raises(ConfigError) as info:
        load_config(None, env)
    assert info.value.source == "environment"
    assert info.value.problems == ["pools: required"]


def test_bad_environment_value_is_named_by_key(tmp_path: Path) -> None:
    found = problems(tmp_path, minimal(tmp_path), {"DYNRUNNER_NATS_ACK_WAIT_SECONDS": "soon"})
    assert found == ["nats.ackWaitSeconds: must be a number (got 'soon')"]


def test_xdg_state_home_is_the_default_parent(tmp_path: Path) -> None:
    cfg = load(tmp_path, minimal(tmp_path), {"XDG_STATE_HOME": "/xdg"})
    assert cfg.state_dir == Path("/xdg/dynrunner")


def test_environment_variable_names_follow_one_scheme() -> None:
    names = env_overrides()
    assert names["DYNRUNNER_GITEA_URL"] == "gitea.url"
    assert names["DYNRUNNER_GITEA_REGISTRATION_TOKEN_FILE"] == "gitea.registrationTokenFile"
    assert names["DYNRUNNER_NATS_ACK_WAIT_SECONDS"] == "nats.ackWaitSeconds"
    assert names["DYNRUNNER_METRICS_ADDRESS"] == "metrics.address"
    assert names["DYNRUNNER_STATE_DIR"] == "stateDir"
    assert names["DYNRUNNER_IDENTITY_TRUST_DOMAIN"] == "identity.trustDomain"
    assert not any("POOLS" in n for n in names)


def test_docs_cover_every_key_and_variable() -> None:
    doc = (Path(__file__).parents[4] / "docs" / "configuration.md").read_text()
    for env_name, key in env_overrides().items():
        assert f"`{env_name}`" in doc, env_name
        assert f"`{key.rsplit('.', 1)[-1]}`" in doc, key
    for key in ("name", "labels", "backend", "kind", "rootDir", "executorCommand", "maxConcurrency"):
        assert f"`{key}`" in doc, key
    for key in ("jobTimeoutMinutes", "retiredKeyFiles", "1.24", "shared"):
        assert key in doc, key


def test_sealing_ensure_key_file_creates_private_key(tmp_path: Path) -> None:
    data = minimal(tmp_path)
    data["sealing"] = {"keyFile": "keys/sealing.key"}
    cfg = load(tmp_path, data)
    path = cfg.sealing.ensure_key_file()
    assert path == tmp_path / "keys" / "sealing.key"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert cfg.sealing.ensure_key_file() == path


def test_local_backend_run_as_user_and_containment(tmp_path: Path) -> None:
    data = minimal(tmp_path)
    data["pools"][0]["backend"] = {"kind": "local", "runAsUser": 65534, "runAsGroup": "nogroup"}
    cfg = load(tmp_path, data)
    backend = cfg.pools[0].backend
    assert (backend.run_as_user, backend.run_as_group, backend.containment) == ("65534", "nogroup", "auto")
    assert cfg.source_file == (tmp_path / "controller.yaml").absolute()
    data["pools"][0]["backend"] = {"kind": "local", "runAsUser": "root", "containment": "chroot"}
    found = problems(tmp_path, data)
    assert any("runAsUser: must not be root" in p for p in found), found
    assert any(p.startswith("pools[0].backend.containment: must be one of 'auto'") for p in found), found


def test_each_pool_s_backend_derives_its_own_defaults_and_says_what_its_executors_need(tmp_path: Path) -> None:
    """Backend-neutral composition: `config` asks each pool's backend model for its derived
    defaults, and the executor options come from the pool's backend (local: the workspace is
    each job's own directory, no workload identity)."""
    from dynrunner.controller.startup import executor_options

    data = minimal(tmp_path)
    data["pools"] = [
        {"name": "a", "labels": ["self-hosted"]},
        {"name": "b", "labels": ["self-hosted"], "backend": {"kind": "local", "rootDir": str(tmp_path / "jobs")}},
    ]
    data["executor"] = {"workspace": "/work"}
    data["identity"] = {"svidTimeoutSeconds": 30}
    cfg = load(tmp_path, data)
    a, b = cfg.pools
    assert (a.backend.root_dir, b.backend.root_dir) == (cfg.state_dir / "local" / "a", tmp_path / "jobs")
    options = executor_options(cfg, a)
    assert options.identity.enabled is False and options.workspace == "/work"


def test_identity_keys_for_backends_that_issue_identities(tmp_path: Path) -> None:
    cfg = load(tmp_path, minimal(tmp_path))
    assert (cfg.identity.cluster, cfg.identity.svid_timeout_s) == ("", 120)
    assert cfg.identity.parent_id_template == "spiffe://{trustDomain}/spire/agent/k8s_psat/{cluster}/{nodeUid}"
    data = minimal(tmp_path)
    data["identity"] = {"cluster": "ci", "parentIdTemplate": "spiffe://{trustDomain}/agent/{node}"}
    [problem] = problems(tmp_path, data)
    assert "identity.parentIdTemplate" in problem and "uses {node}; the placeholders are" in problem
