"""`pools[].backend` for `kind: kubernetes`: one Pod per job (docs/kubernetes.md).

Kubernetes objects the admin writes (the workspace and Workload API volumes, resources,
tolerations, the pod template) are kept as the plain dictionaries Kubernetes' own YAML
spells; they are checked here only for the shape our builders rely on, and the API server
validates the rest (`render` shows the result without a cluster).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dynrunner.controller.config.base import (
    ConfigModel,
    ConfigPath,
    ExecutorNeeds,
    IdentityTimings,
    check_executor_command,
)
from dynrunner.proto.assignment import IdentityWait

DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DEFAULT_WORKLOAD_API_SOCKET = "/spiffe-workload-api/spire-agent.sock"
SPIFFE_CSI_DRIVER = "csi.spiffe.io"
VOLUME_SOURCE_KEYS = frozenset(
    {
        "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi", "downwardAPI",
        "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs",
        "hostPath", "image", "iscsi", "nfs", "persistentVolumeClaim", "photonPersistentDisk", "portworxVolume",
        "projected", "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume",
    }
)  # fmt: skip
"""The members of a Kubernetes `VolumeSource` (core/v1, 1.32): exactly one is set."""


def _volume_source(value: dict[str, Any], what: str) -> dict[str, Any]:
    keys = list(value)
    if len(keys) != 1 or keys[0] not in VOLUME_SOURCE_KEYS:
        raise ValueError(
            f"{what} must be one Kubernetes volume source such as {{emptyDir: {{sizeLimit: 10Gi}}}}, "
            f"{{persistentVolumeClaim: {{claimName: ...}}}} or {{ephemeral: ...}} "
            f"(got keys {', '.join(keys) or 'none'})"
        )
    if not isinstance(value[keys[0]], dict):
        raise ValueError(f"{what}.{keys[0]} must be a mapping")
    return value


class KubernetesBackendConfig(ConfigModel):
    """One Pod per job in `namespace`; see docs/kubernetes.md for every key."""

    kind: Literal["kubernetes"] = "kubernetes"
    kubeconfig: ConfigPath | None = None
    """A kubeconfig file; without it the in-cluster configuration, then $KUBECONFIG or ~/.kube/config."""
    context: str | None = None
    """The kubeconfig context to use (default: its current context)."""
    namespace: str
    image: str = Field(min_length=1)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    executor_command: list[str] = Field(default_factory=lambda: ["dynrunner-executor"], min_length=1)
    identity: bool = True
    workspace: dict[str, Any] = Field(default_factory=lambda: {"emptyDir": {}})
    workload_api_socket: str = DEFAULT_WORKLOAD_API_SOCKET
    workload_api_volume: dict[str, Any] = Field(
        default_factory=lambda: {"csi": {"driver": SPIFFE_CSI_DRIVER, "readOnly": True}}
    )
    image_pull_timeout_s: int = Field(default=300, ge=1, le=24 * 3600)
    start_timeout_s: int = Field(default=600, ge=1, le=24 * 3600)
    """How long a Pod may stay unschedulable, or unable to mount its volumes or create its
    sandbox, before the job fails (a slow image pull without errors is not limited)."""
    resources: dict[str, Any] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    service_account_name: str = ""
    pod_template: dict[str, Any] = Field(default_factory=dict)
    service_pod_security: Literal["restricted", "baseline"] = "restricted"
    """How a job's `services:` sidecars run (docs/kubernetes.md, "Services"): `restricted`
    (runAsNonRoot: an image that starts as root needs a `--user`) or `baseline` (root inside
    the sidecar allowed; still no privilege, no added capabilities, no host namespaces)."""

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str) -> str:
        if not DNS_LABEL_RE.match(value):
            raise ValueError("must be a Kubernetes namespace name: up to 63 lowercase letters, digits and '-'")
        return value

    _check_command = field_validator("executor_command")(check_executor_command)

    @field_validator("workspace")
    @classmethod
    def _check_workspace(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _volume_source(value, "workspace")

    @field_validator("workload_api_volume")
    @classmethod
    def _check_workload_api_volume(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _volume_source(value, "workloadApiVolume")

    @field_validator("workload_api_socket")
    @classmethod
    def _check_socket(cls, value: str) -> str:
        normal = posixpath.normpath(value)
        if not value.startswith("/") or normal != value or posixpath.dirname(normal) == "/":
            raise ValueError(
                "must be an absolute path to the socket inside a directory of its own, "
                f"e.g. {DEFAULT_WORKLOAD_API_SOCKET} (the directory is where the Workload API volume is mounted)"
            )
        return value

    @field_validator("resources")
    @classmethod
    def _check_resources(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = set(value) - {"requests", "limits", "claims"}
        if unknown:
            raise ValueError(f"only requests, limits and claims are allowed (got {', '.join(sorted(unknown))})")
        return value

    @field_validator("pod_template")
    @classmethod
    def _check_template(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = set(value) - {"metadata", "spec"}
        if unknown:
            raise ValueError(f"only metadata and spec can be merged (got {', '.join(sorted(unknown))})")
        for key in ("metadata", "spec"):
            if key in value and not isinstance(value[key], dict):
                raise ValueError(f"{key} must be a mapping")
        return value

    @model_validator(mode="after")
    def _check_account(self) -> KubernetesBackendConfig:
        if self.service_account_name and not DNS_SUBDOMAIN_RE.match(self.service_account_name):
            raise ValueError("serviceAccountName must be a Kubernetes object name")
        return self

    @property
    def workload_api_dir(self) -> str:
        """Where the Workload API volume is mounted (the socket's directory)."""
        return posixpath.dirname(self.workload_api_socket)

    def resolved(self, state_dir: Path, pool: str) -> KubernetesBackendConfig:
        """Nothing of a Pod depends on the controller's state directory."""
        return self

    def executor_needs(self, identity: IdentityTimings) -> ExecutorNeeds:
        """The workspace is the Pod's working directory (its volume's mount); with `identity`
        on, the executor waits for its SVID and finds the Workload API through
        SPIFFE_ENDPOINT_SOCKET, which the Pod sets."""
        wait = IdentityWait(enabled=self.identity, timeout_seconds=identity.svid_timeout_s)
        return ExecutorNeeds(identity=wait)
