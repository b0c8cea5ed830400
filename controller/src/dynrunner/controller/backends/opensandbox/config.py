"""`pools[].backend` for `kind: opensandbox`: one OpenSandbox sandbox (a microVM) per job
(docs/opensandbox.md).

What OpenSandbox itself validates (resource quantities, image references, extension keys) is
passed through as written; what the server would refuse only after a sandbox was asked for —
a metadata or network rule it cannot take, `templateId` with settings a template fixes — is
refused here, at start, with the key that is wrong.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from dynrunner.controller.config.base import ConfigModel, ConfigPath, ExecutorNeeds, IdentityTimings
from dynrunner.proto.assignment import IdentityWait

VM_ENTRYPOINT = "/usr/local/bin/dynrunner-vm-entrypoint"
DEFAULT_WORKLOAD_API_SOCKET = "/run/spire/agent/public/api.sock"
DEFAULT_WORKSPACE = "/home/runner/work"
RESERVED_ENV = frozenset({"OPENSANDBOX_LIFECYCLE"})
"""Names opensandbox-server refuses in a sandbox's env."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TARGET = re.compile(r"^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class EgressRule(ConfigModel):
    action: Literal["allow", "deny"] = "allow"
    target: str
    """A host name or `*.domain` (OpenSandbox takes no IP addresses or CIDRs)."""

    @field_validator("target")
    @classmethod
    def _check_target(cls, value: str) -> str:
        if not _TARGET.match(value.lower()):
            raise ValueError(f"{value!r} must be a host name or *.domain (OpenSandbox takes no IPs or CIDRs)")
        return value.lower()


class NetworkPolicy(ConfigModel):
    """The sandbox's egress: `defaultAction` for what no rule names."""

    default_action: Literal["allow", "deny"] = "deny"
    egress: list[EgressRule] = Field(default_factory=list)


class OpenSandboxBackendConfig(ConfigModel):
    """One sandbox per job on the OpenSandbox server at `url`; see docs/opensandbox.md."""

    kind: Literal["opensandbox"] = "opensandbox"
    url: str
    """The lifecycle API's base, e.g. https://opensandbox.example.org (the SDK adds /v1)."""
    api_key_file: ConfigPath | None = None
    """The server's API key (`OPEN-SANDBOX-API-KEY`); none only for a server without one."""
    image: str = ""
    """The VM image (built from vm/) the sandbox boots."""
    template_id: str = ""
    """Instead of `image`: an fsb microVM template made from that image (Kubernetes only)."""
    entrypoint: list[str] = Field(default_factory=lambda: [VM_ENTRYPOINT], min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    """More environment for the entrypoint (e.g. SPIRE_SERVER_ADDRESS). Never secrets: a
    sandbox's env is visible to whoever reads the runtime's objects."""
    resources: dict[str, str] = Field(default_factory=lambda: {"cpu": "2", "memory": "4Gi"})
    """The sandbox's resource limits (OpenSandbox's `resourceLimits`)."""
    resource_requests: dict[str, str] = Field(default_factory=dict)
    network_policy: NetworkPolicy | None = None
    extensions: dict[str, str] = Field(default_factory=dict)
    """Passed to the server as they are (e.g. `poolRef` for a pre-warmed pool)."""
    timeout_s: int = Field(default=600, ge=0, le=7 * 24 * 3600)
    """Grace: how long past the job's deadline a sandbox may live before OpenSandbox ends it."""
    lease_s: int = Field(default=1200, ge=120, le=7 * 24 * 3600)
    """How long a sandbox outlives the controller's last renewal (renewed every lease/2 while
    the job runs): a controller gone for longer lets its VMs expire on their own."""
    start_timeout_s: int = Field(default=600, ge=10, le=24 * 3600)
    """How long a new sandbox may take to run and accept the assignment."""
    poll_interval_s: float = Field(default=2.0, ge=0.05, le=60)
    """How often the pool's sandboxes are listed (OpenSandbox has no watch)."""
    request_timeout_s: float = Field(default=30.0, gt=0, le=600)
    use_server_proxy: bool = False
    """Reach execd through the server's proxy route (when the controller cannot reach sandboxes)."""
    secure_access: bool = False
    """Create each sandbox with OpenSandbox's `secureAccess`: its endpoints, the server's proxy
    route included, then need a per-sandbox token only the API key can read, not just the
    sandbox's id. opensandbox-server 1.1 honours it on the Kubernetes runtime behind its
    ingress gateway only (it refuses the create elsewhere); without it the proxy route must
    be unreachable from jobs and from the network (docs/security.md, "MicroVMs")."""
    identity: bool = True
    """Give each job its SPIFFE ID through a SPIRE agent in the VM (identity.spireServer)."""
    executor_uid: int = Field(default=1001, ge=0)
    """The uid the executor runs as in the VM (the image's `runner` user): the entry's selector."""
    workload_api_socket: str = DEFAULT_WORKLOAD_API_SOCKET
    """Where the in-VM agent serves the Workload API (the image's SPIFFE_AGENT_SOCKET)."""
    workspace: str = DEFAULT_WORKSPACE
    """The job's workspace in the VM (under the executor user's home in the VM image)."""

    def resolved(self, state_dir: Path, pool: str) -> OpenSandboxBackendConfig:
        """Nothing of it depends on the controller's state directory."""
        return self

    def executor_needs(self, identity: IdentityTimings) -> ExecutorNeeds:
        """The workspace in the VM; with `identity`, the wait for the SVID on the in-VM agent's
        Workload API socket."""
        wait = IdentityWait(
            enabled=self.identity,
            workload_api_socket=self.workload_api_socket if self.identity else "",
            timeout_seconds=identity.svid_timeout_s if self.identity else 0,
        )
        return ExecutorNeeds(workspace=self.workspace, identity=wait)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(
                "must be an http:// or https:// URL of the OpenSandbox server, e.g. https://osb.example.org"
            )
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry credentials: the API key goes in apiKeyFile")
        return value.rstrip("/")

    @field_validator("env")
    @classmethod
    def _check_env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name in RESERVED_ENV:
                raise ValueError(f"{name} is reserved by OpenSandbox")
        return value

    @field_validator("workload_api_socket", "workspace")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if not value.startswith("/") or posixpath.normpath(value) != value or value == "/":
            raise ValueError("must be an absolute path below /")
        return value

    @model_validator(mode="after")
    def _check_source(self) -> OpenSandboxBackendConfig:
        if bool(self.image) == bool(self.template_id):
            raise ValueError("set one of image (the VM image) and templateId (an fsb template made from it)")
        if self.template_id:
            fixed = [
                name
                for name, set_ in (
                    ("env", self.env),
                    ("resourceRequests", self.resource_requests),
                    ("secureAccess", self.secure_access),
                )
                if set_
            ]
            if fixed:
                raise ValueError(f"{', '.join(fixed)} cannot be set with templateId: a template fixes them")
        elif not self.resources and "poolRef" not in self.extensions:
            raise ValueError("resources (cpu, memory) are required unless extensions.poolRef names a pool")
        if self.lease_s < 2 * self.poll_interval_s:
            raise ValueError("leaseSeconds must be at least twice pollIntervalSeconds")
        return self


class SpireServerConfig(ConfigModel):
    """`identity.spireServer`: how the controller reaches the SPIRE Server's admin API, which
    it needs to give each microVM's agent a join token (docs/opensandbox.md, "Identity").

    SPIRE lets a caller make join tokens only when it is *local* (connected to the server's
    admin socket, whose file permissions are the control) or presents an X509-SVID that is an
    admin (listed in the server's `admin_ids`, or issued from an entry with `admin: true`)."""

    socket_path: ConfigPath | None = None
    """The server's admin socket (SPIRE's `socket_path`, e.g. /tmp/spire-server/private/api.sock)."""
    address: str = ""
    """host:port of the server's API, reached with mTLS and an admin X509-SVID."""
    cert_file: ConfigPath | None = None
    """The controller's admin X509-SVID (PEM, leaf first), e.g. kept fresh by spiffe-helper."""
    key_file: ConfigPath | None = None
    bundle_file: ConfigPath | None = None
    """The trust bundle (PEM): verifies the server, and is delivered to each VM's agent."""
    server_name: str = ""
    """The TLS server name (SNI) to send, when not the address's host. The certificate is
    checked for the SPIFFE ID `spiffe://<trust domain>/spire/server`, never for a name."""
    join_token_ttl_s: int = Field(default=900, ge=60, le=7 * 24 * 3600)
    """How long a VM's join token is valid: from delivery to its agent's attestation."""
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)

    @model_validator(mode="after")
    def _check_way(self) -> SpireServerConfig:
        if (self.socket_path is None) == (not self.address):
            raise ValueError("set one of socketPath (the admin socket) and address (mTLS with an admin X509-SVID)")
        if self.address:
            missing = [n for n, p in (("certFile", self.cert_file), ("keyFile", self.key_file)) if p is None]
            if self.bundle_file is None:
                missing.append("bundleFile")
            if missing:
                raise ValueError(f"address needs {', '.join(missing)} (the admin X509-SVID and the trust bundle)")
            host, sep, port = self.address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError("address must be host:port, e.g. spire-server.spire.svc:8081")
        elif self.cert_file is not None or self.key_file is not None:
            raise ValueError("certFile and keyFile are for address (mTLS); the admin socket needs none")
        return self
