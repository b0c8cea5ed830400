"""The controller's configuration: one YAML file plus `DYNRUNNER_*` environment overrides.

Everything is validated once, at start, into frozen pydantic models; the rest of the
controller receives these objects and never reads files or the environment itself.
YAML keys are camelCase (`maxConcurrency`); Python attributes are snake_case, and a
`_s` suffix in Python is spelled `Seconds` in YAML (`ack_wait_s` ↔ `ackWaitSeconds`).
Every problem is reported at once, each with its key path, and secret values are never
echoed. `docs/configuration.md` documents every key.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from dynrunner.controller.backends.kubernetes.config import KubernetesBackendConfig
from dynrunner.controller.backends.opensandbox.config import OpenSandboxBackendConfig, SpireServerConfig
from dynrunner.controller.config.base import ConfigModel, ConfigPath, ExecutorNeeds, check_executor_command
from dynrunner.controller.config.errors import ConfigError, format_validation_error
from dynrunner.controller.config.sources import apply_env, default_state_dir, env_keys, read_yaml
from dynrunner.proto.assignment import ArtifactStoreOptions

__all__ = [
    "ArtifactsConfig",
    "CacheConfig",
    "CacheServerConfig",
    "ConfigError",
    "ControllerConfig",
    "ExecutorDefaults",
    "ExecutorNeeds",
    "GiteaConfig",
    "LocalBackendConfig",
    "LoggingConfig",
    "MetricsConfig",
    "NatsConfig",
    "PoolConfig",
    "SealingConfig",
    "env_overrides",
    "load_cache_server_config",
    "load_config",
]

POOL_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
LABEL_RE = re.compile(r"^[^\s,]{1,255}$")
ACT_RUNNER_LABEL_RE = re.compile(r"^(?P<name>[^:]+):(?P<schema>docker|host|lxc)(:.*)?$", re.IGNORECASE)
"""act_runner's `name:schema[:arg]` label form (`ubuntu-latest:docker://node:20`): the runner
registers the name alone and keeps the schema to itself; Gitea matches `runs-on` against the
name. A label not of these schemas (`pool:a1b2`) is a name, as the Gitea runner reads it."""
GITEA_ENDLESS_TASK_MINUTES = 180
"""Gitea's `[actions] ENDLESS_TASK_TIMEOUT` default: it stops any task running longer (checked
every 30 min), whatever the job's `timeout-minutes` (`services/actions/clear_tasks.go`)."""
STREAM_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
REPLICA_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9])?$")
"""A controller replica's name: a Pod name (a DNS subdomain) or a host name fits."""


def default_replica_name() -> str:
    """The host name up to its first dot (a Pod's host name is the Pod's name)."""
    return socket.gethostname().split(".")[0] or "dynrunner"


MIN_GITEA_REQUEST_TIMEOUT_S = 55.0


_M = TypeVar("_M", bound=BaseModel)
_Model = ConfigModel


class GiteaConfig(_Model):
    url: str
    registration_token_value: SecretStr | None = Field(default=None, alias="registrationToken", repr=False)
    registration_token_file: ConfigPath | None = None
    credential_mode: Literal["ephemeral", "shared"] = "ephemeral"
    request_timeout_s: float = Field(default=65.0, ge=MIN_GITEA_REQUEST_TIMEOUT_S, le=600)
    fetch_interval_s: float = Field(default=0.5, gt=0, le=300)
    fetch_interval_max_s: float = Field(default=1.0, gt=0, le=3600)
    runner_name_prefix: str = Field(default="dynrunner", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

    _token: SecretStr = PrivateAttr(default=SecretStr(""))

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host, e.g. https://gitea.example.com")
        if parts.query or parts.fragment:
            raise ValueError("must not carry a query or fragment")
        if parts.username is not None or parts.password is not None:
            # It becomes every job's GITHUB_SERVER_URL and github.server_url, for any step to print.
            raise ValueError("must not carry credentials (user:password@): every job sees this URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _read_token(self) -> GiteaConfig:
        inline, file = self.registration_token_value, self.registration_token_file
        if inline is not None and file is not None:
            raise ValueError("set only one of registrationToken and registrationTokenFile")
        if file is not None:
            try:
                text = file.read_text(encoding="utf-8").strip()
            except OSError as err:
                raise ValueError(f"registrationTokenFile {file} cannot be read: {err.strerror or err}") from None
            except UnicodeDecodeError:
                raise ValueError(f"registrationTokenFile {file} is not UTF-8 text") from None
            if not text:
                raise ValueError(f"registrationTokenFile {file} is empty")
            self._token = SecretStr(text)
        elif inline is not None and inline.get_secret_value().strip():
            self._token = SecretStr(inline.get_secret_value().strip())
        else:
            raise ValueError(
                "a registration token is required: set registrationTokenFile (preferred) or registrationToken"
            )
        if self.fetch_interval_max_s < self.fetch_interval_s:
            raise ValueError("fetchIntervalMaxSeconds must be ≥ fetchIntervalSeconds")
        return self

    def registration_token(self) -> str:
        """The Gitea runner registration token (read from the file at start)."""
        return self._token.get_secret_value()


class NatsTlsConfig(_Model):
    """TLS to an external NATS: the CA that signs its certificate, and a client certificate."""

    ca_file: ConfigPath | None = None
    cert_file: ConfigPath | None = None
    key_file: ConfigPath | None = None

    @model_validator(mode="after")
    def _check_files(self) -> NatsTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("certFile and keyFile go together (the client certificate and its private key)")
        for name, path in (("caFile", self.ca_file), ("certFile", self.cert_file), ("keyFile", self.key_file)):
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"{name} {path} cannot be read")
        return self

    @property
    def enabled(self) -> bool:
        return any(p is not None for p in (self.ca_file, self.cert_file, self.key_file))


def _read_secret(what: str, path: Path) -> SecretStr:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ValueError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path} is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{what} {path} is empty")
    return SecretStr(text)


class NatsConfig(_Model):
    url: str | None = Field(default=None, repr=False)
    user: str | None = None
    password_file: ConfigPath | None = None
    token_file: ConfigPath | None = None
    creds_file: ConfigPath | None = None
    nkey_seed_file: ConfigPath | None = None
    tls: NatsTlsConfig = Field(default_factory=NatsTlsConfig)
    stream: str = Field(default="DYNRUNNER_ASSIGNMENTS", pattern=STREAM_NAME_RE.pattern)
    subject_prefix: str = Field(default="dynrunner.assignments", pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
    registrations_bucket: str = Field(default="DYNRUNNER_REGISTRATIONS", pattern=STREAM_NAME_RE.pattern)
    launched_bucket: str = Field(default="DYNRUNNER_LAUNCHED", pattern=STREAM_NAME_RE.pattern)
    finalize_bucket: str = Field(default="DYNRUNNER_FINALIZE", pattern=STREAM_NAME_RE.pattern)
    replicas_bucket: str = Field(default="DYNRUNNER_REPLICAS", pattern=STREAM_NAME_RE.pattern)
    permits_bucket: str = Field(default="DYNRUNNER_PERMITS", pattern=STREAM_NAME_RE.pattern)
    replicas: int = Field(default=1, ge=1, le=5)
    ack_wait_s: float = Field(default=60.0, ge=1, le=3600)
    max_deliver: int = Field(default=5, ge=1, le=100)
    duplicate_window_s: float = Field(default=300.0, ge=120, le=86400)
    max_message_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024, le=64 * 1024 * 1024)
    publish_timeout_s: float = Field(default=30.0, gt=0, le=600)
    data_dir: ConfigPath | None = None

    _password: SecretStr | None = PrivateAttr(default=None)
    _token: SecretStr | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        for one in value.split(","):
            parts = urlsplit(one.strip())
            if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
                raise ValueError("must be nats://host:port (or tls://, ws://, wss://; several separated by commas)")
        return value

    @model_validator(mode="after")
    def _read_credentials(self) -> NatsConfig:
        """One way to authenticate, secrets from files (read once, at start)."""
        ways = [
            name
            for name, given in (
                ("user/passwordFile", self.user is not None or self.password_file is not None),
                ("tokenFile", self.token_file is not None),
                ("credsFile", self.creds_file is not None),
                ("nkeySeedFile", self.nkey_seed_file is not None),
            )
            if given
        ]
        if (ways or self.tls.enabled) and self.url is None:
            raise ValueError(
                "credentials and tls are for an external NATS (url); the embedded server makes its own credentials"
            )
        if len(ways) > 1:
            raise ValueError(f"set one way to authenticate to NATS, not {' and '.join(ways)}")
        if ways and self.url is not None and any(urlsplit(u.strip()).username for u in self.url.split(",")):
            raise ValueError(f"the url carries user:password@ and {ways[0]} is set too; use one")
        if (self.user is None) != (self.password_file is None):
            raise ValueError("user and passwordFile go together")
        if self.password_file is not None:
            self._password = _read_secret("passwordFile", self.password_file)
        if self.token_file is not None:
            self._token = _read_secret("tokenFile", self.token_file)
        for name, path in (("credsFile", self.creds_file), ("nkeySeedFile", self.nkey_seed_file)):
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"{name} {path} cannot be read")
        return self

    def password(self) -> str | None:
        return None if self._password is None else self._password.get_secret_value()

    def token(self) -> str | None:
        return None if self._token is None else self._token.get_secret_value()

    @property
    def display_url(self) -> str:
        """`url` with any password replaced, for logs and `check` output."""
        if self.url is None:
            return "(embedded)"
        return ",".join(_redact_userinfo(one.strip()) for one in self.url.split(","))


def _redact_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


class LocalBackendConfig(_Model):
    """The executor as a child process in a fresh directory under `root_dir`.

    Every backend's model has `kind`, `resolved(state_dir, pool)` (its defaults that depend on
    the controller's state directory or the pool) and `executor_needs(identity)`."""

    kind: Literal["local"] = "local"
    root_dir: ConfigPath | None = None
    executor_command: list[str] = Field(default_factory=lambda: ["dynrunner-executor"], min_length=1)
    containment: Literal["auto", "cgroup-v2", "cgroup-v1", "pid-namespace", "process-scan"] = "auto"
    run_as_user: str | None = None
    run_as_group: str | None = None

    @field_validator("run_as_user", "run_as_group", mode="before")
    @classmethod
    def _user_or_group(cls, value: object) -> object:
        """A name or a number (YAML reads `65534` as an int)."""
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("run_as_user")
    @classmethod
    def _check_user(cls, value: str | None) -> str | None:
        if value is not None and value in ("0", "root"):
            raise ValueError("must not be root: jobs would hold every power of the controller")
        return value

    _check_command = field_validator("executor_command")(check_executor_command)

    def resolved(self, state_dir: Path, pool: str) -> LocalBackendConfig:
        """`rootDir` defaults to `<stateDir>/local/<pool>`."""
        if self.root_dir is not None:
            return self
        return self.model_copy(update={"root_dir": state_dir / "local" / pool})

    def executor_needs(self, identity: IdentityConfig) -> ExecutorNeeds:
        """Each job's workspace is its environment's own directory (set as it is made); no
        workload identity is issued on one machine."""
        return ExecutorNeeds()


BackendConfig = Annotated[
    LocalBackendConfig | KubernetesBackendConfig | OpenSandboxBackendConfig, Field(discriminator="kind")
]


class PoolConfig(_Model):
    name: str
    labels: list[str] = Field(min_length=1)
    backend: BackendConfig = Field(default_factory=LocalBackendConfig)
    max_concurrency: int = Field(default=4, ge=1, le=10000)
    job_timeout_minutes: int = Field(default=GITEA_ENDLESS_TASK_MINUTES, ge=1, le=7 * 24 * 60)
    ref_in_spiffe_id: bool = False
    """Put each job's git ref in its SPIFFE ID (`…/<job-key>/refs/heads/main`), so a trust
    policy can allow one branch or tag by matching the ID exactly (docs/identity.md)."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not POOL_NAME_RE.match(value):
            raise ValueError(
                "must be 1-32 characters of lowercase letters, digits and '-', starting and ending with a letter "
                "or digit (it names NATS subjects, consumers and environment labels)"
            )
        return value

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, value: list[str]) -> list[str]:
        for label in value:
            if not LABEL_RE.match(label):
                raise ValueError(f"label {label!r} must be 1-255 characters without whitespace or commas")
            act = ACT_RUNNER_LABEL_RE.match(label)
            if act:
                raise ValueError(
                    f"label {label!r} is act_runner's name:{act['schema']}:... form; dynrunner registers labels "
                    f"as written and Gitea matches a job's runs-on against names only, so no job would ever "
                    f"match it. The pool's backend decides where jobs run: write the name alone, {act['name']!r}"
                )
        if len(set(value)) != len(value):
            raise ValueError("labels must not repeat")
        return value


class SealingConfig(_Model):
    key_file: ConfigPath | None = None
    retired_key_files: list[ConfigPath] = Field(default_factory=list)

    def ensure_key_file(self) -> Path:
        """Create a random 0600 key at `key_file` if none exists (for the demo); return its path."""
        from dynrunner.controller.infra.sealing import ensure_key_file

        assert self.key_file is not None, "ControllerConfig resolves key_file"
        return ensure_key_file(self.key_file)


class ArtifactsConfig(_Model):
    """The ArtifactStore every executor uses; `options()` is what travels in an Assignment.

    Attribute names match `ArtifactStoreOptions`, so either can be read the same way.
    """

    driver: Literal["", "Filesystem", "S3"] = ""
    path: str = ""
    bucket: str = ""
    prefix: str = ""
    endpoint: str = ""
    region: str = ""
    max_size_bytes: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check_driver(self) -> ArtifactsConfig:
        if self.driver == "Filesystem" and not self.path.startswith("/"):
            raise ValueError("driver Filesystem needs `path`: an absolute path every executor can reach")
        if self.driver == "S3" and not self.bucket:
            raise ValueError("driver S3 needs `bucket`")
        if self.endpoint and urlsplit(self.endpoint).scheme not in ("http", "https"):
            raise ValueError("endpoint must be an http:// or https:// URL")
        return self

    def options(self) -> ArtifactStoreOptions:
        return ArtifactStoreOptions(
            driver=self.driver,
            path=self.path,
            bucket=self.bucket,
            prefix=self.prefix,
            endpoint=self.endpoint,
            region=self.region,
            max_size_bytes=self.max_size_bytes,
        )


class CacheConfig(_Model):
    """The `actions/cache` service (docs/cache.md); off unless `url` is set."""

    url: str = ""
    """How executors reach the cache server, e.g. http://dynrunner-cache.ci.svc:8089."""
    serve: bool = True
    """Run the server in this controller; false when `dynrunner-controller cache-server` serves `url`."""
    listen: str = "0.0.0.0:8089"
    key_file: ConfigPath | None = None
    """The HMAC key controllers sign cache grants with and the server checks them with."""
    dir: ConfigPath | None = None
    """The server's index and upload staging."""
    storage: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    """Where archives go (an ArtifactStore); no driver: Filesystem under `dir`/blobs."""
    v2: bool = True
    max_entry_bytes: int = Field(default=10 * 1024**3, ge=1)
    repo_size_limit_bytes: int = Field(default=10 * 1024**3, ge=1)
    total_size_limit_bytes: int = Field(default=0, ge=0)
    retention_days: float = Field(default=7.0, gt=0)
    max_entries_per_repository: int = Field(default=10_000, ge=1)
    """Entries one repository keeps, whatever their size (zero-byte ones too): over it, the
    least recently used go."""
    max_connections: int = Field(default=512, ge=1)
    """Connections the server keeps open at once (at most half the process's file descriptor
    limit); at the cap the longest idle one is closed for a new one."""

    @field_validator("url")
    @classmethod
    def _check_cache_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if value and (parts.scheme not in ("http", "https") or not parts.hostname or parts.query):
            raise ValueError("must be an http:// or https:// URL with a host (or empty: no cache)")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check_limits(self) -> CacheConfig:
        if self.max_entry_bytes > self.repo_size_limit_bytes:
            raise ValueError("maxEntryBytes must not exceed repoSizeLimitBytes")
        return self

    @property
    def enabled(self) -> bool:
        return self.url != ""

    def with_defaults(self, state_dir: Path) -> CacheConfig:
        """`keyFile` and `dir` under `state_dir` when not set."""
        return self.model_copy(
            update={"key_file": self.key_file or state_dir / "cache.key", "dir": self.dir or state_dir / "cache"}
        )


class MetricsConfig(_Model):
    address: str = "127.0.0.1:9464"

    @field_validator("address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        if value == "":
            return value
        _, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("must be host:port (e.g. 127.0.0.1:9464 or 0.0.0.0:9464), or empty to disable")
        return value

    @property
    def enabled(self) -> bool:
        return self.address != ""


class ExecutorDefaults(_Model):
    workspace: str = ""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    outputs_total_limit_bytes: int = Field(default=1024 * 1024, ge=1024, le=1024 * 1024 * 1024)


class IdentityConfig(_Model):
    """The jobs' SPIFFE IDs: `spiffe://<trustDomain>/ci/<owner>/<repository>/<job-key>`, and how
    a backend that issues them (kubernetes) registers them with SPIRE."""

    trust_domain: str = Field(default="dynrunner.local", pattern=r"^[a-z0-9._-]{1,255}$")
    cluster: str = Field(default="", pattern=r"^[A-Za-z0-9._-]{0,255}$")
    parent_id_template: str = "spiffe://{trustDomain}/spire/agent/k8s_psat/{cluster}/{nodeUid}"
    svid_timeout_s: int = Field(default=120, ge=1, le=3600)
    svid_ttl_s: int = Field(default=900, ge=60, le=7 * 24 * 3600)
    class_name: str = ""
    spire_server: SpireServerConfig | None = None
    """The SPIRE Server's admin API, for the join tokens and entries of microVM agents (opensandbox pools)."""

    @field_validator("parent_id_template")
    @classmethod
    def _check_template(cls, value: str) -> str:
        from dynrunner.controller.backends.kubernetes.identity import check_parent_template

        return check_parent_template(value)


class LoggingConfig(_Model):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json_format: bool = Field(default=True, alias="json")


class ControllerConfig(_Model):
    gitea: GiteaConfig
    nats: NatsConfig = Field(default_factory=NatsConfig)
    pools: list[PoolConfig] = Field(min_length=1)
    sealing: SealingConfig = Field(default_factory=SealingConfig)
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    executor: ExecutorDefaults = Field(default_factory=ExecutorDefaults)
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    state_dir: ConfigPath = Field(default_factory=lambda: default_state_dir(os.environ))
    replica: str = Field(default_factory=default_replica_name, pattern=REPLICA_NAME_RE.pattern)

    _source: Path | None = PrivateAttr(default=None)

    @property
    def source_file(self) -> Path | None:
        """The file this configuration was read from (None when built otherwise)."""
        return self._source

    @field_validator("pools")
    @classmethod
    def _unique_pools(cls, value: list[PoolConfig]) -> list[PoolConfig]:
        seen: set[str] = set()
        for pool in value:
            if pool.name in seen:
                raise ValueError(f"pool name {pool.name!r} is used twice")
            seen.add(pool.name)
        return value

    @model_validator(mode="after")
    def _derive_paths(self) -> ControllerConfig:
        """Fill defaults that live under `stateDir`, so every path attribute is a concrete Path."""
        updates: dict[str, Any] = {}
        if self.sealing.key_file is None:
            updates["sealing"] = self.sealing.model_copy(update={"key_file": self.state_dir / "sealing.key"})
        if self.nats.data_dir is None:
            updates["nats"] = self.nats.model_copy(update={"data_dir": self.state_dir / "nats"})
        updates["cache"] = self.cache.with_defaults(self.state_dir)
        updates["pools"] = [
            pool.model_copy(update={"backend": pool.backend.resolved(self.state_dir, pool.name)}) for pool in self.pools
        ]
        return self.model_copy(update=updates)

    @model_validator(mode="after")
    def _check_identity(self) -> ControllerConfig:
        vm = [p.name for p in self.pools if isinstance(p.backend, OpenSandboxBackendConfig) and p.backend.identity]
        if vm and self.identity.spire_server is None:
            raise ValueError(
                f"pool {vm[0]} issues identities in its VMs (backend.identity): identity.spireServer must say "
                "how to reach the SPIRE Server's admin API (or set backend.identity: false)"
            )
        return self

    def pool(self, name: str) -> PoolConfig:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)


class CacheServerConfig(_Model):
    """What `dynrunner-controller cache-server` reads: the `cache`, `stateDir` and `logging`
    sections (of the controllers' own file, or a file of their own; other keys are ignored)."""

    model_config = ConfigDict(extra="ignore")
    cache: CacheConfig = Field(default_factory=CacheConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    state_dir: ConfigPath = Field(default_factory=lambda: default_state_dir(os.environ))

    @model_validator(mode="after")
    def _derive_paths(self) -> CacheServerConfig:
        if not self.cache.url:
            raise ValueError("cache.url is required: the address executors reach this server at")
        return self.model_copy(update={"cache": self.cache.with_defaults(self.state_dir)})


def env_overrides() -> dict[str, str]:
    """Every supported environment variable and the YAML key it overrides (for docs and tests)."""
    return {env: ".".join(path) for env, path in env_keys(ControllerConfig).items()}


# --- loading ---------------------------------------------------------------------------------


def load_config(path: Path | None, env: Mapping[str, str] = os.environ) -> ControllerConfig:
    """Read `path` (optional), apply `DYNRUNNER_*` overrides from `env`, validate everything.

    Raises ConfigError listing every problem with its key path.
    """
    config = _load(ControllerConfig, path, env)
    config._source = path.absolute() if path is not None else None
    return config


def load_cache_server_config(path: Path | None, env: Mapping[str, str] = os.environ) -> CacheServerConfig:
    return _load(CacheServerConfig, path, env)


def _load(model: type[_M], path: Path | None, env: Mapping[str, str]) -> _M:
    data: dict[str, Any] = {}
    base_dir: Path | None = None
    if path is not None:
        data = read_yaml(path)
        base_dir = path.resolve().parent
    apply_env(data, env, model)
    data.setdefault("stateDir", str(default_state_dir(env)))
    try:
        return model.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as err:
        source = str(path) if path is not None else "environment"
        raise ConfigError(source, format_validation_error(err, data, model)) from None
