"""Async client of Gitea's Actions RunnerService and PingService, on connectrpc.

Retries: only calls that are safe to repeat are retried here (Declare, UpdateTask,
UpdateLog, Ping), on transient errors, with exponential backoff and jitter (tenacity).
Register is never retried blindly: a lost response may still have created a runner.
FetchTask is not retried either: the caller's poll loop owns its backoff, and a repeated
FetchTask is a new claim attempt, not a repeat of the old one.

Timeouts: Gitea may hold FetchTask for up to 50 s (long-poll), so every call's client
timeout defaults to 65 s; a shorter timeout would abandon claims the server already made.

Body size: front ends before Gitea often limit request bodies (nginx: 1 MiB by default).
Callers keep requests under `MAX_REQUEST_BYTES` where they can (the reporter splits its
outputs, bounds its log batches); an UpdateTask that cannot be split (one output of up to
1 MiB, the steps of a job of more than ~27,000 of them) is sent gzip-compressed above
`compress_above_bytes` (Gitea's Connect handlers accept gzip, as every connect-go handler).
UpdateLog is not measured (that costs as much as encoding it): its callers bound batches.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import pyqwest
from connectrpc.codec import Codec
from connectrpc.compat import google_protobuf_binary_codec, google_protobuf_json_codec
from connectrpc.errors import ConnectError
from google.protobuf.message import Message
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from dynrunner.proto import __version__
from dynrunner.proto._gen.ping.v1 import messages_pb2 as ping_pb
from dynrunner.proto._gen.ping.v1.services_connect import PingServiceClient
from dynrunner.proto._gen.runner.v1 import messages_pb2 as pb
from dynrunner.proto._gen.runner.v1.services_connect import RunnerServiceClient
from dynrunner.proto.gitea.errors import GiteaError, from_connect
from dynrunner.proto.gitea.types import (
    FetchResult,
    LogRow,
    Result,
    RunnerInfo,
    Task,
    TaskState,
    UpdateTaskResult,
    ts_to_proto,
)

T = TypeVar("T")

USER_AGENT = f"dynrunner/{__version__}"
DEFAULT_TIMEOUT_S = 65.0
MAX_REQUEST_BYTES = 768 * 1024
"""A request body size that passes common front ends (nginx's default limit is 1 MiB)."""
HEADER_UUID = "x-runner-uuid"
HEADER_TOKEN = "x-runner-token"


@dataclass(frozen=True, slots=True)
class RunnerCredentials:
    """What authenticates every call but Register: a runner's uuid and token."""

    uuid: str
    token: str


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long safe calls are retried on transient errors."""

    attempts: int = 8
    max_delay_s: float = 120.0
    initial_s: float = 0.2
    max_backoff_s: float = 10.0


NO_RETRY = RetryPolicy(attempts=1)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, GiteaError) and exc.transient


class GiteaClient:
    """One Gitea instance, optionally bound to one runner's credentials.

    `base_url` is Gitea's ROOT_URL; the RPCs live under ``<base_url>/api/actions``.
    Use `with_credentials` for a client of the same instance as another runner; they share
    the HTTP connection pool.
    """

    def __init__(
        self,
        base_url: str,
        credentials: RunnerCredentials | None = None,
        *,
        http_client: pyqwest.Client | None = None,
        json: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy = RetryPolicy(),
        gzip_requests: bool = False,
        compress_above_bytes: int | None = MAX_REQUEST_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.credentials = credentials
        self._http = http_client or pyqwest.Client()
        self._json = json
        self._timeout_s = timeout_s
        self._retry = retry
        self._gzip = gzip_requests
        self._compress_above = compress_above_bytes
        codec: Codec = google_protobuf_json_codec() if json else google_protobuf_binary_codec()
        address = f"{self.base_url}/api/actions"
        kwargs = {"codec": codec, "http_client": self._http, "timeout_ms": int(timeout_s * 1000)}
        self._runner_gzip = RunnerServiceClient(address, **kwargs)  # gzip is connectrpc's default
        if not gzip_requests:
            kwargs["send_compression"] = None
        self._runner = RunnerServiceClient(address, **kwargs)
        self._ping = PingServiceClient(address, **kwargs)

    def with_credentials(self, credentials: RunnerCredentials) -> GiteaClient:
        return GiteaClient(
            self.base_url,
            credentials,
            http_client=self._http,
            json=self._json,
            timeout_s=self._timeout_s,
            retry=self._retry,
            gzip_requests=self._gzip,
            compress_above_bytes=self._compress_above,
        )

    async def aclose(self) -> None:
        """Nothing to release: the HTTP client (and its pool) belongs to whoever made it."""

    async def __aenter__(self) -> GiteaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing -----------------------------------------------------------------

    def _headers(self, request: Message, *, auth: bool = True) -> dict[str, str]:
        headers = {"user-agent": USER_AGENT}
        if self._sends_nothing(request):
            # The HTTP client sends an empty body without any length, which HTTP/1.1 allows
            # but strict front ends (some load balancers) answer with 411 Length Required.
            headers["content-length"] = "0"
        if auth:
            if self.credentials is None:
                raise ValueError("this call needs runner credentials")
            if self.credentials.uuid:
                headers[HEADER_UUID] = self.credentials.uuid
            if self.credentials.token:
                headers[HEADER_TOKEN] = self.credentials.token
        return headers

    def _sends_nothing(self, request: Message) -> bool:
        """Whether `request` goes out as an empty body: a binary message with every field at
        its default (FetchTask with tasks_version 0), uncompressed (JSON is at least `{}`,
        a gzip stream never empty)."""
        return not self._json and not self._gzip and not request.ListFields()

    def _runner_for(self, request: Message) -> RunnerServiceClient:
        """The gzip-sending service client for a request over `compress_above_bytes`.
        Measuring a request costs about as much as encoding it: for UpdateTask only."""
        if self._compress_above is not None and request.ByteSize() > self._compress_above:
            return self._runner_gzip
        return self._runner

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            return await fn()
        except ConnectError as err:
            raise from_connect(err) from err

    async def _retrying(self, fn: Callable[[], Awaitable[T]], policy: RetryPolicy | None = None) -> T:
        policy = policy or self._retry
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_transient),
            stop=stop_after_attempt(policy.attempts) | stop_after_delay(policy.max_delay_s),
            wait=wait_random_exponential(multiplier=policy.initial_s, max=policy.max_backoff_s),
            reraise=True,
        ):
            with attempt:
                return await self._call(fn)
        raise AssertionError("unreachable")

    def _timeout_ms(self, timeout_s: float | None) -> int:
        return int((timeout_s if timeout_s is not None else self._timeout_s) * 1000)

    # -- RPCs ---------------------------------------------------------------------

    async def ping(self, data: str = "dynrunner", *, retry: RetryPolicy | None = None) -> str:
        req = ping_pb.PingRequest(data=data)
        resp = await self._retrying(lambda: self._ping.ping(req, headers=self._headers(req, auth=False)), retry)
        return resp.data

    async def register(
        self,
        *,
        name: str,
        registration_token: str,
        labels: Sequence[str],
        version: str = USER_AGENT,
        ephemeral: bool = False,
        capabilities: Iterable[str] = (),
    ) -> RunnerInfo:
        """Register a runner. Never retried: a lost answer may still have created one."""
        req = pb.RegisterRequest(
            name=name,
            token=registration_token,
            version=version,
            labels=list(labels),
            ephemeral=ephemeral,
            capabilities=list(capabilities),
        )
        resp = await self._call(lambda: self._runner.register(req, headers=self._headers(req, auth=False)))
        return RunnerInfo.from_proto(resp.runner)

    async def declare(
        self,
        *,
        labels: Sequence[str],
        version: str = USER_AGENT,
        capabilities: Iterable[str] = (),
        retry: RetryPolicy | None = None,
    ) -> RunnerInfo:
        req = pb.DeclareRequest(version=version, labels=list(labels), capabilities=list(capabilities))
        resp = await self._retrying(lambda: self._runner.declare(req, headers=self._headers(req)), retry)
        return RunnerInfo.from_proto(resp.runner)

    async def fetch_task(self, tasks_version: int = 0, *, timeout_s: float | None = None) -> FetchResult:
        """One claim attempt. Not retried (see the module docstring)."""
        req = pb.FetchTaskRequest(tasks_version=tasks_version)
        resp = await self._call(
            lambda: self._runner.fetch_task(req, headers=self._headers(req), timeout_ms=self._timeout_ms(timeout_s))
        )
        task = Task.from_proto(resp.task) if resp.HasField("task") else None
        return FetchResult(task=task, tasks_version=resp.tasks_version)

    async def update_task(
        self,
        state: TaskState,
        outputs: Mapping[str, str] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> UpdateTaskResult:
        req = pb.UpdateTaskRequest(state=state.to_proto(), outputs=dict(outputs or {}))
        runner = self._runner_for(req)
        resp = await self._retrying(lambda: runner.update_task(req, headers=self._headers(req)), retry)
        return UpdateTaskResult(result=Result.from_wire(resp.state.result), sent_outputs=frozenset(resp.sent_outputs))

    async def update_log(
        self,
        task_id: int,
        index: int,
        rows: Sequence[LogRow],
        *,
        no_more: bool = False,
        retry: RetryPolicy | None = None,
    ) -> int:
        """Send `rows` starting at absolute row `index`; returns the server's ack index."""
        req = pb.UpdateLogRequest(task_id=task_id, index=index, no_more=no_more)
        # Rows of one log() call share their time: convert each distinct time once.
        last_time: object = None
        stamp = None
        for row in rows:
            if row.time is not last_time:
                last_time, stamp = row.time, ts_to_proto(row.time)
            req.rows.add(time=stamp, content=row.content)
        resp = await self._retrying(lambda: self._runner.update_log(req, headers=self._headers(req)), retry)
        return resp.ack_index


def exit_without_finalization(code: int) -> NoReturn:
    """End a process that used this client without interpreter finalization, once everything is flushed.

    pyqwest hands every response (awaited or abandoned alike) to the event loop from a tokio
    thread with `loop.call_soon_threadsafe`, whose self-pipe write releases the GIL. When the
    main thread finishes the job and starts finalizing before that thread takes the GIL back,
    CPython up to 3.13 ends the thread with pthread_exit, which cannot unwind through Rust
    frames: the process aborts (SIGABRT) after the task was finalized, and the exit status
    no longer says so. Seen in about 1 of 20–60 runs on a loaded machine (core dumps: the
    thread in `take_gil` under `_write_to_self`, the main thread in `Py_FinalizeEx`), also
    when no request was abandoned. CPython 3.14 parks such threads instead (gh-87135).
    Callers use it once their work is done (their threads and tasks have ended); logs and the
    standard streams are flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
