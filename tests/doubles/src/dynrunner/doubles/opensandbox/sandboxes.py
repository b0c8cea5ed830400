"""The sandbox store and its lifecycle: what the server's runtime service does, on local processes.

States and transitions (opensandbox-server 1.1.1, `services/docker/docker_service.py` for how a
container's state becomes a sandbox's, `services/k8s/batchsandbox_provider.py` for Pending):

    create ─> Pending ─(booted)─> Running ─(entrypoint exits 0)─> Terminated
                 │                   │    ─(exits non-zero)───> Failed  (message has the code)
                 │                   ├─ pause ─> Pausing ─> Paused ─ resume ─> Resuming ─> Running
                 └───────────────────┴─ delete, or expiresAt passes ─> Stopping ─> (gone: 404)

`runtime="docker"` answers create once the entrypoint has started (state Running, as
DockerSandboxService does); `runtime="kubernetes"` answers 202 Pending and boots afterwards,
during which endpoints are 404 `KUBERNETES::POD_IP_NOT_AVAILABLE` (the SDK retries that one).
An image the double does not know stays Pending in the Kubernetes runtime (the pod never
starts) and fails the create with 500 `DOCKER::SANDBOX_IMAGE_PULL_FAILED` in the Docker one.
A terminated or failed sandbox stays listed until it is deleted or expires, as a stopped
container does.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import shutil
import signal
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from dynrunner.doubles.opensandbox import boot
from dynrunner.doubles.opensandbox.errors import ApiError, check_metadata, check_port, future_utc
from dynrunner.doubles.opensandbox.schema import CreateSandboxRequest, Pagination, SandboxList, SandboxView, Status

Runtime = Literal["docker", "kubernetes"]
_PREFIX = {"docker": "DOCKER", "kubernetes": "KUBERNETES"}


@dataclass
class CreateFailure:
    """An injected create failure. `after_create` creates the sandbox and still answers the
    error: the response lost on its way back, which is why create needs reconciliation."""

    status: int = 500
    code: str = "SANDBOX::INTERNAL_ERROR"
    message: str = "injected failure"
    after_create: bool = False


@dataclass
class Clock:
    """Wall time plus an offset that tests advance (expiry in virtual time)."""

    offset: timedelta = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


@dataclass
class Sandbox:
    id: str
    request: CreateSandboxRequest
    created_at: datetime
    expires_at: datetime | None
    directory: Path
    status: Status
    env: dict[str, str | None] = field(default_factory=dict)
    vm_env: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    process: asyncio.subprocess.Process | None = None
    watcher: asyncio.Task[None] | None = None
    access_token: str = field(default="", repr=False)
    """With `secureAccess`: what a caller of its endpoints must send (`SECURE_ACCESS_HEADER`)."""

    @property
    def rootfs(self) -> Path:
        return self.directory / "rootfs"

    @property
    def console(self) -> Path:
        return self.directory / "console.log"

    @property
    def state(self) -> str:
        return self.status.state


def _status(state: str, reason: str, message: str, when: datetime) -> Status:
    return Status.model_validate({"state": state, "reason": reason, "message": message, "lastTransitionAt": when})


class Sandboxes:
    def __init__(
        self,
        state_dir: Path,
        images: Mapping[str, boot.LocalImage],
        *,
        runtime: Runtime = "docker",
        boot_delay_s: float = 0.0,
        max_timeout_s: int | None = None,
        clock: Clock | None = None,
        gateway: bool = False,
    ) -> None:
        self.state_dir = state_dir
        self.images = dict(images)
        self.runtime = runtime
        self.gateway = gateway
        """The Kubernetes runtime behind `ingress.mode = gateway`, the one setup in which the
        server honours `secureAccess`."""
        self.boot_delay_s = boot_delay_s
        self.max_timeout_s = max_timeout_s
        self.clock = clock or Clock()
        self.create_failures: list[CreateFailure] = []
        self.created: list[str] = []
        self.on_change: Callable[[], None] = lambda: None
        self._by_id: dict[str, Sandbox] = {}

    # -- helpers ---------------------------------------------------------------------------

    def code(self, name: str) -> str:
        return f"{_PREFIX[self.runtime]}::{name}"

    def _set(self, box: Sandbox, state: str, reason: str, message: str) -> None:
        box.status = _status(state, reason, message, self.clock.now())
        self.on_change()

    def get(self, sandbox_id: str) -> Sandbox:
        box = self._by_id.get(sandbox_id)
        if box is None:
            raise ApiError(404, self.code("SANDBOX_NOT_FOUND"), f"Sandbox {sandbox_id} not found.")
        return box

    def all(self) -> list[Sandbox]:
        return list(self._by_id.values())

    def view(self, box: Sandbox, *, with_image: bool = True) -> SandboxView:
        request = box.request
        return SandboxView.model_validate(
            {
                "id": box.id,
                "image": {"uri": request.image.uri} if with_image and request.image else None,
                "platform": request.platform,
                "status": box.status,
                "metadata": dict(box.metadata) or None,
                "extensions": request.extensions or None,
                "entrypoint": request.entrypoint,
                "expiresAt": box.expires_at,
                "createdAt": box.created_at,
            }
        )

    # -- create ----------------------------------------------------------------------------

    async def create(self, request: CreateSandboxRequest) -> Sandbox:
        failure = self.create_failures.pop(0) if self.create_failures else None
        if failure and not failure.after_create:
            raise ApiError(failure.status, failure.code, failure.message)
        self._check_create(request)
        now = self.clock.now()
        sandbox_id = str(uuid.uuid4())
        directory = self.state_dir / "sandboxes" / sandbox_id
        directory.mkdir(parents=True)
        box = Sandbox(
            id=sandbox_id,
            request=request,
            created_at=now,
            expires_at=now + timedelta(seconds=request.timeout) if request.timeout is not None else None,
            directory=directory,
            status=_status("Pending", "CREATING", "Sandbox is being created", now),
            env=dict(request.env or {}),
            metadata=dict(request.metadata or {}),
            access_token=secrets.token_urlsafe(24) if request.secure_access else "",
        )
        image = self.images.get(request.image.uri if request.image else "")
        if self.runtime == "docker":
            if image is None:
                shutil.rmtree(directory)
                raise ApiError(500, self.code("SANDBOX_IMAGE_PULL_FAILED"), f"Failed to pull image {request.image}.")
            self._by_id[sandbox_id] = box
            await self._boot(box, image)
        else:
            self._by_id[sandbox_id] = box
            if image is not None:
                box.watcher = asyncio.create_task(self._boot_later(box, image), name=f"sandbox-{sandbox_id}-boot")
        self.created.append(sandbox_id)
        self.on_change()
        if failure:
            raise ApiError(failure.status, failure.code, failure.message)
        return box

    def _check_create(self, request: CreateSandboxRequest) -> None:
        invalid = "SANDBOX::INVALID_PARAMETER"
        if request.template_id:
            raise ApiError(404, "FSB::TEMPLATE_NOT_FOUND", f"Template {request.template_id} not found.")
        if request.snapshot_id:
            raise ApiError(404, "SNAPSHOT::NOT_FOUND", f"Snapshot {request.snapshot_id} not found.")
        if (request.extensions or {}).get("poolRef", "").strip():
            raise ApiError(400, "SANDBOX::UNSUPPORTED_POOL_REF", "poolRef is not modelled by the OpenSandbox double.")
        if request.lifecycle is not None:
            raise ApiError(400, invalid, "lifecycle hooks are not supported by the Docker provider.")
        if request.volumes:
            raise ApiError(400, "VOLUME::INVALID_BACKEND", "the OpenSandbox double mounts no volumes.")
        if request.secure_access and self.runtime == "docker":
            raise ApiError(
                400,
                invalid,
                "secureAccess is not supported when runtime.type='docker'. "
                "Use the Kubernetes runtime to create secured sandboxes.",
            )
        if request.secure_access and not self.gateway:
            raise ApiError(
                400,
                invalid,
                "secureAccess is currently supported only for Kubernetes sandboxes exposed "
                "through ingress.mode='gateway'. Configure ingress gateway mode or disable secureAccess.",
            )
        check_metadata(request.metadata)
        if request.timeout is not None and self.max_timeout_s is not None and request.timeout > self.max_timeout_s:
            raise ApiError(
                400, invalid, f"Sandbox timeout {request.timeout}s exceeds configured maximum of {self.max_timeout_s}s."
            )

    async def _boot_later(self, box: Sandbox, image: boot.LocalImage) -> None:
        await asyncio.sleep(self.boot_delay_s)
        if box.state == "Pending" and box.id in self._by_id:
            await self._boot(box, image)

    async def _boot(self, box: Sandbox, image: boot.LocalImage) -> None:
        argv = list(box.request.entrypoint or ["tail", "-f", "/dev/null"])
        box.vm_env = boot.environment(box.rootfs, image, box.env)
        try:
            box.process = await boot.start(box.rootfs, image, argv, box.vm_env, box.console)
        except OSError as err:
            self._set(box, "Failed", "CONTAINER_START_FAILED", f"Sandbox container failed to start: {err}")
            return
        self._set(box, "Running", "CONTAINER_RUNNING", "Sandbox container started successfully.")
        watcher = asyncio.create_task(self._watch(box, box.process), name=f"sandbox-{box.id}-process")
        box.watcher = watcher

    async def _watch(self, box: Sandbox, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if code < 0:
            code = 128 - code  # killed by a signal: Docker's ExitCode (State.ExitCode) is 128+N
        if box.state == "Stopping" or box.id not in self._by_id:
            return
        if code == 0:
            self._set(box, "Terminated", "CONTAINER_EXITED", "Sandbox container exited successfully.")
        else:
            self._set(box, "Failed", "CONTAINER_EXITED_ERROR", f"Sandbox container exited with code {code}.")

    # -- list ------------------------------------------------------------------------------

    def query(self, states: list[str] | None, metadata: dict[str, str], page: int, page_size: int) -> SandboxList:
        wanted = {state.lower() for state in states or []}
        boxes = [
            box
            for box in self._by_id.values()
            if (not wanted or box.state.lower() in wanted)
            and all(box.metadata.get(key) == value for key, value in metadata.items())
        ]
        boxes.sort(key=lambda box: box.created_at, reverse=True)
        total_pages = math.ceil(len(boxes) / page_size) if boxes else 0
        start = (page - 1) * page_size
        return SandboxList(
            items=[self.view(box) for box in boxes[start : start + page_size]],
            pagination=Pagination.model_validate(
                {
                    "page": page,
                    "pageSize": page_size,
                    "totalItems": len(boxes),
                    "totalPages": total_pages,
                    "hasNextPage": page < total_pages,
                }
            ),
        )

    # -- delete, expiry --------------------------------------------------------------------

    async def delete(self, sandbox_id: str) -> None:
        await self._remove(self.get(sandbox_id))

    async def _remove(self, box: Sandbox) -> None:
        self._set(box, "Stopping", "SANDBOX_STOPPING", "Sandbox is being removed.")
        process = box.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        if box.watcher is not None and box.watcher is not asyncio.current_task():
            box.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await box.watcher
        self._by_id.pop(box.id, None)
        self.on_change()

    def next_expiry(self) -> datetime | None:
        return min((box.expires_at for box in self._by_id.values() if box.expires_at), default=None)

    async def expire_due(self) -> list[str]:
        """Remove every sandbox whose expiresAt has passed (the server's expiration timer)."""
        now = self.clock.now()
        due = [box for box in self._by_id.values() if box.expires_at is not None and box.expires_at <= now]
        for box in due:
            await self._remove(box)
        return [box.id for box in due]

    async def close(self) -> None:
        for box in list(self._by_id.values()):
            await self._remove(box)

    # -- renew, pause, resume, metadata ----------------------------------------------------

    def renew(self, sandbox_id: str, expires_at: datetime) -> datetime:
        box = self.get(sandbox_id)
        when = future_utc(expires_at, self.clock.now(), self.code("INVALID_EXPIRATION"))
        if box.expires_at is None:
            raise ApiError(
                409,
                self.code("INVALID_EXPIRATION"),
                f"Sandbox {sandbox_id} does not have automatic expiration enabled.",
            )
        box.expires_at = when
        self.on_change()
        return when

    def pause(self, sandbox_id: str) -> None:
        box = self.get(sandbox_id)
        if box.state != "Running" or box.process is None:
            raise ApiError(409, self.code("SANDBOX_NOT_RUNNING"), f"Sandbox {sandbox_id} is not running.")
        self._set(box, "Pausing", "SANDBOX_PAUSING", "Pausing sandbox.")
        self._signal(box, signal.SIGSTOP)
        self._set(box, "Paused", "CONTAINER_PAUSED", "Sandbox container is paused.")

    def resume(self, sandbox_id: str) -> None:
        box = self.get(sandbox_id)
        if box.state != "Paused":
            raise ApiError(409, self.code("SANDBOX_NOT_PAUSED"), f"Sandbox {sandbox_id} is not paused.")
        self._set(box, "Resuming", "SANDBOX_RESUMING", "Resuming sandbox.")
        self._signal(box, signal.SIGCONT)
        self._set(box, "Running", "CONTAINER_RUNNING", "Sandbox container is running.")

    @staticmethod
    def _signal(box: Sandbox, sig: signal.Signals) -> None:
        if box.process is not None and box.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(box.process.pid, sig)

    def patch_metadata(self, sandbox_id: str, patch: Mapping[str, str | None]) -> Sandbox:
        box = self.get(sandbox_id)
        for key in patch:
            if key.startswith("opensandbox.io/"):
                raise ApiError(
                    400, "INVALID_METADATA_LABEL", f"Metadata key '{key}' is reserved (opensandbox.io/ prefix)."
                )
        check_metadata({key: str(value) for key, value in patch.items() if value is not None})
        for key, value in patch.items():
            if value is None:
                box.metadata.pop(key, None)
            else:
                box.metadata[key] = str(value)
        return box

    def endpoint_ready(self, sandbox_id: str, port: int) -> Sandbox:
        """The sandbox, if an endpoint for `port` can be published now."""
        check_port(port, self.code("INVALID_PORT"))
        box = self.get(sandbox_id)
        if self.runtime == "kubernetes" and box.state == "Pending":
            raise ApiError(
                404, "KUBERNETES::POD_IP_NOT_AVAILABLE", "Pod IP is not yet available. The Pod may still be starting."
            )
        return box
