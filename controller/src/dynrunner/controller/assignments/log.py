"""The assignment log: sealed Assignments on a JetStream work-queue stream, one subject per pool.

Each message is a `SealedAssignment` envelope (the whole assignment sealed with the
controller's key); the launcher opens and authenticates it. A message that is no envelope —
garbage, or an assignment in the previous format, which sealed only its secrets and could be
altered by anyone able to publish — is refused here: dropped, logged and counted
(`assignments_refused_total{reason="unauthenticated"}`), never run.

The claimer publishes with `Nats-Msg-Id` = assignment id, so a retried publish is stored
once; launchers pull from a durable consumer per pool (`launcher-<pool>`), acknowledge once
the environment exists, and get the message again after `ack_wait` if they crash before.

Delivery limit: the consumer itself redelivers without limit and this module applies
`nats.maxDeliver`. A server-side limit would strand a message in a work-queue stream
forever if the handler of its last delivery crashed, and then nobody finalizes the task.
Here, a delivery past the limit is marked `exhausted`: the launcher finalizes the task failed
and `term()`s it, and if that is interrupted too, the message simply comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_before_delay, wait_exponential_jitter

from dynrunner.controller.assignments.delivery import Delivery
from dynrunner.controller.config.model import NatsConfig
from dynrunner.controller.infra.loops import Stopping
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.proto.assignment import (
    AssignmentError,
    NewerEnvelope,
    NotAnEnvelope,
    SealedAssignment,
    decode_sealed,
    encode_sealed,
)

__all__ = ["AssignmentLog", "AssignmentLogError", "Delivery", "PublishError", "connect_nats", "open_bucket", "stored"]

log = logging.getLogger(__name__)

MSG_ID_HEADER = "Nats-Msg-Id"
_ATTEMPT_TIMEOUT_S = 5.0
_PUBLISH_ATTEMPT_TIMEOUT_S = 2.0  # a PubAck takes milliseconds; a lost one is retried (deduplicated)
_FETCH_WAIT_S = 2.0  # an idle pull's expiry; also bounds the wait after a NATS restart
_UNKNOWN_VERSION_DELAY_S = 30.0
_RECONNECT_WAIT_S = 1


class AssignmentLogError(RuntimeError):
    """The stream or a consumer cannot be set up as configured (the message says what to change)."""


class PublishError(RuntimeError):
    """An assignment could not be stored; the claimer must finalize its task failed with this reason."""


def consumer_name(pool: str) -> str:
    return f"launcher-{pool}"


async def connect_nats(
    url: str,
    *,
    options: Mapping[str, Any] | None = None,
    name: str = "dynrunner-controller",
    connect_wait_s: float = 5.0,
    connect_timeout_s: float = 2.0,
) -> Client:
    """Connect, trying for about `connect_wait_s`; once connected, reconnect forever (the
    controller outlives NATS restarts). Connection events are logged as one line each instead
    of nats-py's tracebacks; the failed attempts of the first connect are not (the error
    raised names the last one). `options`: credentials and TLS (`nats_auth.client_options`)."""
    client: list[Client] = []
    last_error: list[BaseException] = []

    async def on_error(err: Exception) -> None:
        last_error[:] = [err]
        log.log(logging.WARNING if client else logging.DEBUG, "nats: %s", err or type(err).__name__)

    async def on_disconnect() -> None:
        if client and not (client[0].is_closed or client[0].is_draining):
            log.warning("nats: disconnected")

    async def on_reconnect() -> None:
        log.info("nats: reconnected")

    nc = Client()
    attempts = max(1, int(connect_wait_s / _RECONNECT_WAIT_S))
    try:
        # nats-py never returns from a connect whose TLS handshake failed verification: bound it.
        async with asyncio.timeout((attempts + 1) * (connect_timeout_s + _RECONNECT_WAIT_S)):
            await nc.connect(
                servers=[u.strip() for u in url.split(",")],
                name=name,
                connect_timeout=connect_timeout_s,  # type: ignore[arg-type]  # seconds; nats-py accepts a float
                allow_reconnect=True,
                max_reconnect_attempts=attempts,
                reconnect_time_wait=_RECONNECT_WAIT_S,
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                **(options or {}),
            )
    except (OSError, nats.errors.Error, TimeoutError) as err:
        with contextlib.suppress(Exception):
            await nc.close()  # a refused connect leaves its socket open otherwise
        cause = last_error[0] if last_error else err
        if isinstance(cause, TimeoutError) and not str(cause):
            cause = TimeoutError("no connection in the time allowed (a server certificate not trusted?)")
        raise AssignmentLogError(
            f"cannot connect to NATS at {_redacted(url)}: {cause or type(cause).__name__}"
        ) from err
    # The attempt limit was for the first connect only; nats-py reads it at every reconnect.
    nc.options["max_reconnect_attempts"] = -1
    client.append(nc)
    return nc


async def stored(kv: KeyValue, key: str) -> tuple[bytes, int] | None:
    """The value under `key` and its revision; None when there is none (never put, deleted,
    purged or expired)."""
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:  # also KeyDeletedError
        return None
    return (entry.value, int(entry.revision or 0)) if entry.value is not None else None


async def bucket_keys(js: JetStreamContext, bucket: str) -> list[str]:
    """Every key the bucket holds a message for (values and delete markers alike).

    nats-py's `KeyValue.keys()` can answer "no keys" for a bucket that has some: its watcher
    signals the end when the server has nothing left to push while the client has not yet
    handled what was pushed. The stream's subject list has no such window."""
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=prefix + ">")
    return sorted(subject[len(prefix) :] for subject in info.state.subjects or {})


async def open_bucket(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    """The key-value bucket `config.bucket`, created as configured if it does not exist."""
    try:
        return await js.key_value(config.bucket)
    except nats.js.errors.BucketNotFoundError:
        kv = await js.create_key_value(config)
        log.info("created key-value bucket %s", config.bucket)
        return kv


def _redacted(url: str) -> str:
    return ",".join(re.sub(r"//[^@/]*@", "//***@", one.strip()) for one in url.split(","))


def _transient(err: BaseException) -> bool:
    if isinstance(err, nats.errors.MaxPayloadError | nats.errors.ConnectionClosedError):
        return False
    if isinstance(err, nats.js.errors.ServiceUnavailableError | nats.js.errors.NoStreamResponseError):
        return True
    if isinstance(err, nats.js.errors.APIError):
        return err.code is not None and err.code >= 500
    return isinstance(
        err,
        asyncio.TimeoutError
        | nats.errors.TimeoutError
        | nats.errors.NoRespondersError
        | nats.errors.OutboundBufferLimitError
        | nats.errors.ConnectionReconnectingError
        | nats.errors.StaleConnectionError
        | OSError,
    )


class AssignmentLog:
    """Publish to and consume from the assignment stream. Build with `connect()`."""

    def __init__(
        self,
        nc: Client,
        cfg: NatsConfig,
        pools: Sequence[str],
        *,
        metrics: Metrics | None = None,
        owns_connection: bool = True,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=_ATTEMPT_TIMEOUT_S)
        self.cfg = cfg
        self.pools = tuple(pools)
        self._metrics = metrics
        self._owns_connection = owns_connection
        self._subscriptions: set[JetStreamContext.PullSubscription] = set()

    @classmethod
    async def connect(
        cls,
        nats_url: str,
        cfg: NatsConfig,
        pools: Sequence[str],
        *,
        metrics: Metrics | None = None,
        connect_wait_s: float = 5.0,
        options: Mapping[str, Any] | None = None,
    ) -> AssignmentLog:
        """Connect (trying for about `connect_wait_s`, with `options`: credentials and TLS) and
        make sure the stream and one durable consumer per pool exist as configured."""
        nc = await connect_nats(nats_url, options=options, connect_wait_s=connect_wait_s)
        self = cls(nc, cfg, pools, metrics=metrics)
        try:
            await self.ensure()
        except BaseException:
            await nc.close()
            raise
        return self

    def subject(self, pool: str) -> str:
        return f"{self.cfg.subject_prefix}.{pool}"

    def stream_config(self) -> StreamConfig:
        return StreamConfig(
            name=self.cfg.stream,
            description="dynrunner assignments waiting for a launcher",
            subjects=[f"{self.cfg.subject_prefix}.*"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            discard=DiscardPolicy.NEW,
            num_replicas=self.cfg.replicas,
            duplicate_window=self.cfg.duplicate_window_s,
            max_msg_size=self.cfg.max_message_bytes,
        )

    def consumer_config(self, pool: str) -> ConsumerConfig:
        return ConsumerConfig(
            name=consumer_name(pool),
            durable_name=consumer_name(pool),
            description=f"launchers of pool {pool}",
            filter_subject=self.subject(pool),
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.cfg.ack_wait_s,
            max_deliver=-1,  # the limit is applied by Delivery (see the module docstring)
        )

    async def ensure(self) -> None:
        """Create or update the stream and the consumers; idempotent across restarts."""
        want = self.stream_config()
        try:
            info = await self.js.stream_info(want.name)  # type: ignore[arg-type]
        except nats.js.errors.NotFoundError:
            await self.js.add_stream(want)
            log.info("created stream %s", want.name)
        else:
            have = info.config
            if have.retention != want.retention or have.storage != want.storage:
                raise AssignmentLogError(
                    f"stream {want.name} exists with retention={have.retention} storage={have.storage}; "
                    "dynrunner needs retention=workqueue storage=file, which cannot be changed in place: "
                    f"drain it and delete it (`nats stream rm {want.name}`), or set nats.stream to a new name"
                )
            changed = {
                k: (getattr(have, k), getattr(want, k))
                for k in ("subjects", "num_replicas", "duplicate_window", "max_msg_size", "discard")
                if getattr(have, k) != getattr(want, k)
            }
            if changed:
                try:
                    await self.js.update_stream(want)
                except nats.js.errors.APIError as err:
                    raise AssignmentLogError(f"stream {want.name} cannot be updated ({changed}): {err}") from err
                log.info("updated stream %s: %s", want.name, changed)
        if self.nc.max_payload < self.cfg.max_message_bytes:
            log.warning(
                "the NATS server accepts messages up to %d bytes (its max_payload), less than nats.maxMessageBytes "
                "(%d): larger assignments will fail to publish and their tasks will be finalized failed",
                self.nc.max_payload,
                self.cfg.max_message_bytes,
            )
        for pool in self.pools:
            try:
                await self.js.add_consumer(self.cfg.stream, self.consumer_config(pool))
            except nats.js.errors.APIError as err:
                raise AssignmentLogError(f"consumer {consumer_name(pool)} cannot be created or updated: {err}") from err

    # --- publishing -------------------------------------------------------------------------

    async def publish(self, sealed_assignment: SealedAssignment) -> int:
        """Store the assignment once (retried within `nats.publishTimeoutSeconds`); returns its stream
        sequence. Raises PublishError when it could not be stored."""
        a = sealed_assignment
        if a.pool not in self.pools:
            raise PublishError(f"pool {a.pool!r} is not configured (pools: {', '.join(self.pools)})")
        data = encode_sealed(a)
        if len(data) > self.cfg.max_message_bytes:
            raise PublishError(
                f"the assignment is {len(data)} bytes, more than nats.maxMessageBytes ({self.cfg.max_message_bytes})"
            )
        subject, headers = self.subject(a.pool), {MSG_ID_HEADER: a.assignment_id}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.publish_timeout_s

        def before_sleep(state: RetryCallState) -> None:
            err = state.outcome.exception() if state.outcome is not None else None
            log.warning("publishing %s failed (attempt %d), retrying: %r", a.assignment_id, state.attempt_number, err)
            if self._metrics is not None:
                self._metrics.publish_retries.labels(pool=a.pool).inc()

        try:
            async for attempt in AsyncRetrying(
                stop=stop_before_delay(self.cfg.publish_timeout_s),
                wait=wait_exponential_jitter(multiplier=0.1, max=2.0, jitter=0.2),
                retry=retry_if_exception(_transient),
                before_sleep=before_sleep,
                reraise=True,
            ):
                with attempt:
                    if not self.nc.is_connected:
                        # nats-py would buffer the publish until it reconnects, and a buffered publish
                        # could still be stored after we gave up and finalized the task.
                        raise nats.errors.ConnectionReconnectingError
                    timeout = max(0.05, min(_PUBLISH_ATTEMPT_TIMEOUT_S, deadline - loop.time()))
                    ack = await self.js.publish(subject, data, timeout=timeout, headers=headers)
        except Exception as err:
            raise PublishError(
                f"JetStream did not accept the assignment within {self.cfg.publish_timeout_s:g}s: "
                f"{type(err).__name__}: {err}"
            ) from err
        if self._metrics is not None:
            self._metrics.published.labels(pool=a.pool).inc()
            if ack.duplicate:  # None (not False) for a first publish
                self._metrics.publish_duplicates.labels(pool=a.pool).inc()
        if ack.duplicate:
            log.info("assignment %s was already stored (seq %d)", a.assignment_id, ack.seq)
        return ack.seq

    # --- consuming --------------------------------------------------------------------------

    async def deliveries(
        self, pool: str, batch: int | Callable[[], int] = 1, stopping: Stopping | None = None
    ) -> AsyncGenerator[Delivery, None]:
        """Deliveries for `pool`, pulled only when the caller asks for the next one, so a launcher
        without free capacity holds none. `batch` (or what it returns at each pull) is how many
        one pull may take: a launcher with several free slots takes several at once, one NATS
        round trip for all of them. Messages pulled but not handed out when the generator is
        closed are given back (nak) for immediate redelivery. Close with
        `contextlib.aclosing` (or `close()`). It ends once `stopping` is set, after the pull
        in flight: a cancellation a pull lost does not keep it pulling."""
        if pool not in self.pools:
            raise ValueError(f"pool {pool!r} is not configured")
        sub = await self.js.pull_subscribe_bind(consumer_name(pool), stream=self.cfg.stream)
        self._subscriptions.add(sub)
        failures = 0
        held: list[Msg] = []
        try:
            while stopping is None or not stopping.is_set():
                if not self.nc.is_connected:
                    await asyncio.sleep(0.05)  # a pull sent now would wait out its expiry after the reconnect
                    continue
                try:
                    held = await sub.fetch(max(1, batch() if callable(batch) else batch), timeout=_FETCH_WAIT_S)
                    failures = 0
                except TimeoutError:  # nats-py raises its own subclass, and sometimes asyncio's
                    continue
                except nats.errors.ConnectionClosedError:
                    raise
                except nats.errors.Error as err:
                    failures += 1
                    await self._recover(pool, err, failures)
                    continue
                while held:
                    delivery = await self._delivery(pool, held.pop(0))
                    if delivery is not None:
                        yield delivery
        finally:
            self._subscriptions.discard(sub)
            for msg in held:
                with contextlib.suppress(nats.errors.Error):
                    await msg.nak()
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _recover(self, pool: str, err: nats.errors.Error, failures: int) -> None:
        """A pull failed other than by timing out: the consumer or stream may be gone (deleted by
        hand, or lost with a NATS store) or leaderless for a moment. Re-create what is missing,
        with backoff, instead of ending the launcher."""
        log.warning("pulling assignments of pool %s failed (%d in a row): %r", pool, failures, err)
        if self._metrics is not None:
            self._metrics.errors.labels(pool=pool, kind="nats").inc()
        await asyncio.sleep(min(0.25 * 2 ** min(failures, 5), 5.0))
        try:
            await self.ensure()
        except (AssignmentLogError, nats.errors.Error) as again:
            log.warning("re-creating the assignment stream and consumers failed: %r", again)

    async def _delivery(self, pool: str, msg: Msg) -> Delivery | None:
        meta = msg.metadata
        try:
            assignment = decode_sealed(msg.data)
        except AssignmentError as err:
            await self._unreadable(pool, msg, err)
            return None
        if meta.num_delivered > 1 and self._metrics is not None:
            self._metrics.redeliveries.labels(pool=pool).inc()
        return Delivery(
            assignment=assignment,
            num_delivered=meta.num_delivered,
            max_deliver=self.cfg.max_deliver,
            stream_seq=meta.sequence.stream,
            _msg=msg,
            _nc=self.nc,
            _ack_wait_s=self.cfg.ack_wait_s,
        )

    async def _unreadable(self, pool: str, msg: Msg, err: AssignmentError) -> None:
        """A newer envelope may be read by a newer controller during a rolling upgrade: leave it
        for that one. Anything else is refused: dropped, logged and counted."""
        seq = msg.metadata.sequence.stream
        if isinstance(err, NewerEnvelope):
            log.error("stream seq %d: %s; leaving it for a newer controller", seq, err)
            await msg.nak(delay=_UNKNOWN_VERSION_DELAY_S)
            return
        if self._metrics is not None:
            self._metrics.errors.labels(pool=pool, kind="unreadable_assignment").inc()
            self._metrics.refused.labels(pool=pool, reason="unauthenticated").inc()
        if isinstance(err, NotAnEnvelope) and err.previous_format:
            log.error(
                "stream seq %d is refused and dropped: an assignment in the previous format, whose workflow and "
                "settings are not authenticated (anyone able to publish to NATS could have written them); "
                "Gitea fails its task when its zombie timeout ends it",
                seq,
            )
        else:
            log.error("stream seq %d is refused and dropped: %s", seq, err)
        await msg.term()

    async def unacknowledged(self, stream_seq: int, assignment_id: str) -> bool:
        """Whether the assignment's message (stream sequence `stream_seq`) is still in the
        stream: waiting, or delivered and not yet acknowledged. A work-queue stream removes a
        message once it is acknowledged (or terminated); the message id guards against a
        sequence reused by a re-created stream."""
        try:
            msg = await self.js.get_msg(self.cfg.stream, stream_seq)
        except nats.js.errors.NotFoundError:
            return False
        return (msg.headers or {}).get(MSG_ID_HEADER) == assignment_id

    async def pending(self, pool: str) -> int:
        """Assignments of `pool` not yet acknowledged: waiting, or delivered and in flight."""
        info = await self.js.consumer_info(self.cfg.stream, consumer_name(pool))
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def close(self) -> None:
        for sub in list(self._subscriptions):
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._subscriptions.clear()
        if self._owns_connection and not self.nc.is_closed:
            await self.nc.close()

    async def __aenter__(self) -> AssignmentLog:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
