"""The lifecycle API's request bodies and responses, as opensandbox-server 1.1.1 declares them.

Field names, aliases and bounds follow the server's published contract (`/openapi.json` of
1.1.1): camelCase on the wire, `timeout` ≥ 60, `entrypoint` ≥ 1 item, `pageSize` 1–200. The
whole-request rules the server checks in a model validator (exactly one of image and
snapshotId, an entrypoint with an image, resourceLimits unless poolRef, templateId alone) are
checked here in the same place, so FastAPI answers a broken body with the same 422
`{"detail": [...]}` as the real server does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RESERVED_ENV = "OPENSANDBOX_LIFECYCLE"
_TEMPLATE_EXCLUSIVE = (
    ("image", "image"),
    ("snapshot_id", "snapshotId"),
    ("entrypoint", "entrypoint"),
    ("env", "env"),
    ("resource_limits", "resourceLimits"),
    ("resource_requests", "resourceRequests"),
    ("volumes", "volumes"),
    ("platform", "platform"),
    ("credential_proxy", "credentialProxy"),
    ("lifecycle", "lifecycle"),
)


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True)


class ImageAuth(_Wire):
    username: str
    password: str


class ImageSpec(_Wire):
    uri: str
    auth: ImageAuth | None = None


class PlatformSpec(_Wire):
    os: str
    arch: str


class NetworkRule(_Wire):
    action: str
    target: str = Field(min_length=1)


class NetworkPolicy(_Wire):
    default_action: str | None = Field(None, alias="defaultAction")
    egress: list[NetworkRule] = Field(default_factory=list)


class CredentialProxy(_Wire):
    enabled: bool = False


class Hook(_Wire):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    command: list[str] = Field(min_length=1)
    timeout_seconds: int | None = Field(None, alias="timeoutSeconds", ge=1, le=10800)


class PeriodicHook(_Wire):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    name: str = Field(min_length=1)
    schedule: str = Field(min_length=1)
    command: list[str] = Field(min_length=1)
    timeout_seconds: int | None = Field(None, alias="timeoutSeconds", ge=1, le=300)


class Lifecycle(_Wire):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    pre_start: Hook | None = Field(None, alias="preStart")
    periodic: list[PeriodicHook] | None = None


class Volume(_Wire):
    """Shape only: the double mounts no volumes (a create that asks for one is refused)."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    host: dict[str, Any] | None = None
    pvc: dict[str, Any] | None = None
    ossfs: dict[str, Any] | None = None
    mount_path: str = Field(alias="mountPath", pattern=r"^/.*")
    read_only: bool = Field(False, alias="readOnly")
    sub_path: str | None = Field(None, alias="subPath")

    @model_validator(mode="after")
    def _one_backend(self) -> Volume:
        given = [b for b in (self.host, self.pvc, self.ossfs) if b is not None]
        if len(given) != 1:
            raise ValueError("Exactly one backend (host, pvc, ossfs) must be specified.")
        return self


class CreateSandboxRequest(_Wire):
    image: ImageSpec | None = None
    snapshot_id: str | None = Field(None, alias="snapshotId")
    platform: PlatformSpec | None = None
    timeout: int | None = Field(None, ge=60)
    resource_limits: dict[str, str] | None = Field(None, alias="resourceLimits")
    resource_requests: dict[str, str] | None = Field(None, alias="resourceRequests")
    env: dict[str, str | None] | None = None
    metadata: dict[str, str] | None = None
    lifecycle: Lifecycle | None = None
    entrypoint: list[str] | None = Field(None, min_length=1)
    network_policy: NetworkPolicy | None = Field(None, alias="networkPolicy")
    credential_proxy: CredentialProxy | None = Field(None, alias="credentialProxy")
    secure_access: bool = Field(False, alias="secureAccess")
    volumes: list[Volume] | None = None
    extensions: dict[str, str] | None = None
    template_id: str | None = Field(None, alias="templateId", min_length=1)

    @model_validator(mode="after")
    def _whole_request(self) -> CreateSandboxRequest:
        if self.env and RESERVED_ENV in self.env:
            raise ValueError(f"Environment variable '{RESERVED_ENV}' is reserved. Use the lifecycle request field.")
        if self.template_id is not None and self.template_id.strip():
            clash = sorted(
                wire
                for attr, wire in _TEMPLATE_EXCLUSIVE
                if getattr(self, attr) is not None and (attr != "snapshot_id" or (self.snapshot_id or "").strip())
            )
            if self.secure_access:
                clash = sorted([*clash, "secureAccess"])
            if clash:
                raise ValueError(f"templateId cannot be combined with: {', '.join(clash)}")
            if self.timeout is None:
                raise ValueError("timeout is required when templateId is provided.")
            return self
        self.template_id = None
        if (self.extensions or {}).get("poolRef", "").strip():
            if self.lifecycle is not None:
                raise ValueError("lifecycle cannot be used together with poolRef.")
            if (self.snapshot_id or "").strip():
                raise ValueError("snapshotId cannot be used together with poolRef.")
            return self
        if self.credential_proxy and self.credential_proxy.enabled and self.network_policy is None:
            raise ValueError("credentialProxy.enabled requires networkPolicy.")
        has_image = self.image is not None and bool(self.image.uri.strip())
        has_snapshot = bool((self.snapshot_id or "").strip())
        if has_image == has_snapshot:
            raise ValueError("Exactly one of image or snapshotId must be provided.")
        if has_image and not self.entrypoint:
            raise ValueError("Entrypoint is required when image is provided.")
        if self.resource_limits is None:
            raise ValueError("resourceLimits is required when poolRef is not provided.")
        return self


class RenewRequest(_Wire):
    expires_at: datetime = Field(alias="expiresAt")


class Status(_Wire):
    state: str
    reason: str | None = None
    message: str | None = None
    last_transition_at: datetime | None = Field(None, alias="lastTransitionAt")


class SandboxView(_Wire):
    """`Sandbox` (GET, list items); `CreateSandboxResponse` is the same without `image`."""

    id: str
    image: ImageSpec | None = None
    platform: PlatformSpec | None = None
    status: Status
    metadata: dict[str, str] | None = None
    extensions: dict[str, str] | None = None
    entrypoint: list[str] | None = None
    expires_at: datetime | None = Field(None, alias="expiresAt")
    created_at: datetime = Field(alias="createdAt")


class Pagination(_Wire):
    page: int
    page_size: int = Field(alias="pageSize")
    total_items: int = Field(alias="totalItems")
    total_pages: int = Field(alias="totalPages")
    has_next_page: bool = Field(alias="hasNextPage")


class SandboxList(_Wire):
    items: list[SandboxView]
    pagination: Pagination


class Endpoint(_Wire):
    endpoint: str
    headers: dict[str, str] | None = None


State = Literal["Pending", "Running", "Pausing", "Paused", "Resuming", "Stopping", "Terminated", "Failed"]
