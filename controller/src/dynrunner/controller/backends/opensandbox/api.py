"""The one module that talks to OpenSandbox (an import-linter contract checks it), through the
official `opensandbox` SDK: the lifecycle API (create, list by metadata, get, delete, renew,
metadata patch), a sandbox's console (the diagnostics API) and its execd file API (the delivery,
the executor's accepted state).

The SDK's own readiness wait (`Sandbox.create`) is not used: it kills the sandbox when its
budget runs out or the caller is cancelled, and a controller killed mid-create must leave a
sandbox that the next attempt finds by its metadata. So creating is one POST (never retried:
create takes no idempotency key; a lost answer is found by listing), and waiting is the
backend's. Reads are retried by the SDK's transport (idempotent methods only). Wire types
stop here: callers get `SandboxView`s and `OpenSandboxError`s.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from opensandbox import Sandbox
from opensandbox.adapters.factory import AdapterFactory
from opensandbox.config import ConnectionConfig
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.models.filesystem import MoveEntry, WriteEntry
from opensandbox.models.sandboxes import (
    NetworkPolicy,
    NetworkRule,
    SandboxFilter,
    SandboxImageSpec,
    SandboxInfo,
)

from dynrunner.controller.backends.opensandbox.builders import SandboxRequest
from dynrunner.controller.backends.opensandbox.diagnosis import SandboxView

log = logging.getLogger(__name__)

PAGE_SIZE = 200
"""The largest page opensandbox-server serves."""


CLOSED = "CLIENT_CLOSED"


class OpenSandboxError(Exception):
    """A request the server refused or did not answer; `status` 0 is no answer at all."""

    def __init__(self, status: int, code: str, message: str, sandbox: str = "") -> None:
        super().__init__(f"{message} ({status} {code})" if status else message)
        self.status = status
        self.code = code
        self.message = message
        self.sandbox = sandbox
        """The sandbox it concerns, if one: its id is kept out of job logs (`public`)."""

    @property
    def public(self) -> str:
        """The message without the sandbox's id (which reaches its execd; docs/security.md)."""
        return self.message.replace(self.sandbox, "<the VM>") if self.sandbox else self.message

    @property
    def transient(self) -> bool:
        return self.status in (0, 429, 500, 502, 503, 504) and self.code != CLOSED


class NotFound(OpenSandboxError):
    pass


def _translate(err: Exception, what: str, sandbox: str = "") -> OpenSandboxError:
    if isinstance(err, OpenSandboxError):
        return err
    if isinstance(err, SandboxApiException):
        status = err.status_code or 0
        code = err.error.code if err.error else ""
        message = (err.error.message if err.error else "") or str(err)
        kind = NotFound if status == 404 else OpenSandboxError
        return kind(status, code, f"{what}: {message}", sandbox)
    cause = err.__cause__ if isinstance(err, SandboxException) and err.__cause__ is not None else err
    return OpenSandboxError(0, type(cause).__name__, f"{what}: {cause}", sandbox)


def view(info: SandboxInfo) -> SandboxView:
    return SandboxView(
        id=info.id,
        state=info.status.state,
        reason=info.status.reason or "",
        message=info.status.message or "",
        metadata=dict(info.metadata or {}),
        created_at=_utc(info.created_at),
        expires_at=_utc(info.expires_at),
        changed_at=_utc(info.status.last_transition_at),
    )


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _policy(request: SandboxRequest) -> NetworkPolicy | None:
    policy = request.network_policy
    if policy is None:
        return None
    return NetworkPolicy(
        defaultAction=policy.default_action,
        egress=[NetworkRule(action=rule.action, target=rule.target) for rule in policy.egress],
    )


class OpenSandboxApi:
    def __init__(self, config: ConnectionConfig, transport: httpx.AsyncBaseTransport) -> None:
        self._config = config
        self._transport = transport
        self._sandboxes = AdapterFactory(config).create_sandbox_service()
        self._diagnostics = AdapterFactory(config).create_diagnostics_service()
        self.url = config.domain or ""
        self._closed = False
        self.requests: Counter[str] = Counter()
        """Requests sent, by kind (for benchmarks and `check`)."""

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        api_key_file: Path | None = None,
        request_timeout_s: float = 30.0,
        use_server_proxy: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> OpenSandboxApi:
        api_key = api_key_file.read_text(encoding="utf-8").strip() if api_key_file is not None else None
        base = ConnectionConfig(
            domain=url,
            api_key=api_key,
            request_timeout=timedelta(seconds=request_timeout_s),
            use_server_proxy=use_server_proxy,
            disable_metrics=True,
            headers=dict(headers or {}),
        )
        transport = base.new_owned_transport()
        return cls(base.model_copy(update={"transport": transport}), transport)

    async def aclose(self) -> None:
        self._closed = True
        await self._transport.aclose()

    def _sending(self, kind: str) -> None:
        """Count a request, and refuse one after `aclose`: the closed transport would open a
        connection that nobody closes."""
        if self._closed:
            raise OpenSandboxError(0, CLOSED, f"the OpenSandbox client of {self.url} is closed")
        self.requests[kind] += 1

    # -- the lifecycle API ----------------------------------------------------------------------

    async def create(self, request: SandboxRequest) -> str:
        """POST one sandbox; its id. Not retried (see the module's docstring)."""
        self._sending("create")
        timeout = timedelta(seconds=request.timeout_s)
        try:
            if request.template_id:
                created = await self._sandboxes.create_sandbox_from_template(
                    template_id=request.template_id,
                    timeout=timeout,
                    metadata=dict(request.metadata),
                    network_policy=_policy(request),
                    extensions=dict(request.extensions),
                )
            else:
                created = await self._sandboxes.create_sandbox(
                    spec=SandboxImageSpec(image=request.image),
                    entrypoint=list(request.entrypoint),
                    env=dict(request.env),
                    metadata=dict(request.metadata),
                    timeout=timeout,
                    resource=dict(request.resources),
                    network_policy=_policy(request),
                    extensions=dict(request.extensions),
                    volumes=None,
                    resource_requests=dict(request.resource_requests) or None,
                    secure_access=request.secure_access,
                )
        except Exception as err:
            raise _translate(err, "creating a sandbox") from None
        return created.id

    async def get(self, sandbox_id: str) -> SandboxView:
        self._sending("get")
        try:
            return view(await self._sandboxes.get_sandbox_info(sandbox_id))
        except Exception as err:
            raise _translate(err, f"reading sandbox {sandbox_id}", sandbox_id) from None

    async def list(self, metadata: Mapping[str, str]) -> list[SandboxView]:
        """Every sandbox whose metadata has all of `metadata` (all pages)."""
        found: list[SandboxView] = []
        page = 1
        while True:
            self._sending("list")
            try:
                paged = await self._sandboxes.list_sandboxes(
                    SandboxFilter(metadata=dict(metadata), page=page, page_size=PAGE_SIZE)
                )
            except Exception as err:
                raise _translate(err, "listing sandboxes") from None
            found += [view(info) for info in paged.sandbox_infos]
            if not paged.pagination.has_next_page:
                return found
            page += 1

    async def delete(self, sandbox_id: str) -> bool:
        """Terminate and remove; False if it did not exist."""
        self._sending("delete")
        try:
            await self._sandboxes.kill_sandbox(sandbox_id)
        except Exception as err:
            translated = _translate(err, f"deleting sandbox {sandbox_id}", sandbox_id)
            if isinstance(translated, NotFound):
                return False
            raise translated from None
        return True

    async def renew(self, sandbox_id: str, expires_at: datetime) -> datetime:
        self._sending("renew")
        try:
            renewed = await self._sandboxes.renew_sandbox_expiration(sandbox_id, expires_at)
        except Exception as err:
            raise _translate(err, f"renewing sandbox {sandbox_id}", sandbox_id) from None
        return _utc(renewed.expires_at) or expires_at

    async def patch_metadata(self, sandbox_id: str, patch: Mapping[str, str | None]) -> SandboxView:
        self._sending("patch")
        try:
            return view(await self._sandboxes.patch_sandbox_metadata(sandbox_id, dict(patch)))
        except Exception as err:
            raise _translate(err, f"updating the metadata of sandbox {sandbox_id}", sandbox_id) from None

    async def console(self, sandbox_id: str) -> str:
        """The sandbox's console as the server keeps it (its container's log: the last lines)."""
        self._sending("console")
        try:
            logs = await self._diagnostics.get_logs(sandbox_id, scope="container")
        except Exception as err:
            raise _translate(err, f"reading the console of sandbox {sandbox_id}", sandbox_id) from None
        return logs.content or ""

    # -- execd: the delivery ----------------------------------------------------------------------

    async def files(self, sandbox_id: str, timeout_s: float) -> SandboxFiles:
        """The sandbox's file API, once execd answers (within `timeout_s`)."""
        self._sending("connect")
        try:
            sandbox = await Sandbox.connect(
                sandbox_id, connection_config=self._config, connect_timeout=timedelta(seconds=timeout_s)
            )
        except Exception as err:
            raise _translate(err, f"reaching execd in sandbox {sandbox_id}", sandbox_id) from None
        return SandboxFiles(sandbox, self._sending)


class SandboxFiles:
    """execd's file API of one sandbox (writes are fsynced and chmodded one after the other);
    refused, as the lifecycle API is, once the client is closed."""

    def __init__(self, sandbox: Sandbox, sending: Callable[[str], None]) -> None:
        self._sandbox = sandbox
        self._sending = sending

    async def write(self, directory: str, files: Mapping[str, bytes], mode: int) -> None:
        self._sending("upload")
        entries = [WriteEntry(path=f"{directory}/{name}", data=data, mode=mode) for name, data in files.items()]
        try:
            await self._sandbox.files.write_files(entries)
        except Exception as err:
            raise _translate(err, f"writing into sandbox {self._sandbox.id}", self._sandbox.id) from None

    async def delete(self, paths: Collection[str]) -> None:
        self._sending("remove")
        try:
            await self._sandbox.files.delete_files(list(paths))
        except Exception as err:
            raise _translate(err, f"deleting files in sandbox {self._sandbox.id}", self._sandbox.id) from None

    async def read(self, path: str) -> bytes | None:
        """The file's bytes; None when there is no such file."""
        self._sending("download")
        try:
            return await self._sandbox.files.read_bytes(path)
        except Exception as err:
            translated = _translate(err, f"reading {path} in sandbox {self._sandbox.id}", self._sandbox.id)
            if isinstance(translated, NotFound):
                return None
            raise translated from None

    async def exists(self, path: str) -> bool:
        self._sending("info")
        try:
            await self._sandbox.files.get_file_info([path])
        except Exception as err:
            translated = _translate(err, f"looking at {path} in sandbox {self._sandbox.id}", self._sandbox.id)
            if isinstance(translated, NotFound):
                return False
            raise translated from None
        return True

    async def rename(self, source: str, destination: str) -> bool:
        """Rename; False when `destination` exists already (execd refuses to replace it)."""
        self._sending("move")
        try:
            await self._sandbox.files.move_files([MoveEntry(source=source, destination=destination)])
        except Exception as err:
            translated = _translate(err, f"renaming {source} in sandbox {self._sandbox.id}", self._sandbox.id)
            if await self.exists(destination):
                return False
            raise translated from None
        return True
