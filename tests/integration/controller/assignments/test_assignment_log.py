"""The assignment log against a real nats-server: dedupe by assignment id, ack / nak / term,
in-progress heartbeats, redelivery after ack-wait, the delivery limit, unreadable messages,
idempotent setup, and what happens while NATS is down or restarts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StreamConfig

from dynrunner.controller.assignments.log import AssignmentLog, AssignmentLogError, Delivery, PublishError
from dynrunner.controller.config.model import NatsConfig
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.proto.assignment import Sealed, encode, encode_sealed, split_secrets
from dynrunner.proto.gitea import Task
from tests.fixtures.controller_samples import RUNNER_TOKEN, LogFactory, make_assignment
from tests.fixtures.nats import NatsServer


async def next_delivery(it: AsyncGenerator[Delivery, None], within: float = 10.0) -> Delivery:
    return await asyncio.wait_for(anext(it), within)


async def nothing_within(log: AssignmentLog, seconds: float, pool: str = "pod") -> bool:
    """Another launcher pulls for `seconds`: True if it got nothing. (A raw pull whose request
    expires on the server when it gives up, so it cannot swallow a later delivery.)"""
    sub = await log.js.pull_subscribe_bind(f"launcher-{pool}", stream=log.cfg.stream)
    try:
        msgs = await sub.fetch(1, timeout=seconds)
    except nats.errors.TimeoutError:
        return True
    finally:
        await sub.unsubscribe()
    for msg in msgs:
        await msg.nak()
    return False


async def stream_messages(log: AssignmentLog) -> int:
    info = await log.js.stream_info(log.cfg.stream)
    return info.state.messages


async def test_publish_stores_an_assignment_once_per_id(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer, metrics: Metrics
) -> None:
    log = await open_log(nats_server_module.url, nats_config)
    sealed = sealer.seal_assignment(make_assignment())
    first = await log.publish(sealed)
    again = await log.publish(sealed)
    assert first == again
    assert await stream_messages(log) == 1
    assert await log.pending("pod") == 1
    assert metrics.sample("dynrunner_assignments_published_total", pool="pod") == 2
    assert metrics.sample("dynrunner_publish_duplicates_total", pool="pod") == 1
    other = await log.publish(sealer.seal_assignment(make_assignment()))
    assert other == first + 1


async def test_publish_refuses_what_it_cannot_store(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server_module.url, nats_config.model_copy(update={"max_message_bytes": 65536}))
    with pytest.raises(PublishError, match="pool 'gpu' is not configured"):
        await log.publish(sealer.seal_assignment(make_assignment(pool="gpu")))
    huge = make_assignment()
    huge = huge.replace(task=Task(id=1, workflow_payload=b"x" * 70000))
    with pytest.raises(PublishError, match=r"the assignment is \d+ bytes, more than nats.maxMessageBytes \(65536\)"):
        await log.publish(sealer.seal_assignment(huge))
    assert await stream_messages(log) == 0


async def test_ack_removes_the_assignment(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server_module.url, nats_config)
    original = make_assignment()
    await log.publish(sealer.seal_assignment(original))
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        d = await next_delivery(it)
        assert (d.num_delivered, d.is_redelivery, d.is_last_attempt, d.exhausted) == (1, False, False, False)
        assert RUNNER_TOKEN.encode() not in encode_sealed(d.assignment)  # still sealed
        assert sealer.unseal_assignment(d.assignment) == original
        await d.ack()
    assert await log.pending("pod") == 0
    assert await stream_messages(log) == 0


async def test_nak_delivers_again_and_delay_holds_it_back(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer, metrics: Metrics
) -> None:
    log = await open_log(nats_server_module.url, nats_config.model_copy(update={"ack_wait_s": 30}))
    await log.publish(sealer.seal_assignment(make_assignment()))
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        d = await next_delivery(it)
        await d.nak()
        d = await next_delivery(it)
        assert d.num_delivered == 2 and d.is_redelivery
        await d.nak(delay_s=1.5)
    assert await nothing_within(log, 0.5)
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        d = await next_delivery(it)
        assert d.num_delivered == 3
        await d.ack()
    assert metrics.sample("dynrunner_redeliveries_total", pool="pod") == 2


async def test_unacknowledged_delivery_comes_back_after_ack_wait(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    """A launcher that dies mid-launch: its delivery is given to the next one after ackWait."""
    log = await open_log(nats_server_module.url, nats_config)
    a = make_assignment()
    await log.publish(sealer.seal_assignment(a))
    async with contextlib.aclosing(log.deliveries("pod")) as crashed:
        first = await next_delivery(crashed)
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        again = await next_delivery(it)
        assert again.assignment.assignment_id == a.assignment_id
        assert again.num_delivered == 2 and again.stream_seq == first.stream_seq
        await again.ack()


async def test_in_progress_keeps_the_delivery_while_a_launch_is_slow(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    """With ackWait 1 s, a launch of 2.5 s keeps its delivery when it heartbeats; another launcher
    pulling meanwhile gets nothing. Without heartbeats the other launcher gets it."""
    log = await open_log(nats_server_module.url, nats_config)
    await log.publish(sealer.seal_assignment(make_assignment()))
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        d = await next_delivery(it)
        async with d.keep_alive(interval_s=0.3):
            assert await nothing_within(log, 2.5)
        await d.in_progress()
        assert await nothing_within(log, 0.6)
        info = await log.js.consumer_info(log.cfg.stream, "launcher-pod")
        assert info.num_redelivered == 0 and info.num_ack_pending == 1
    async with contextlib.aclosing(log.deliveries("pod")) as rival:
        stolen = await next_delivery(rival, within=5)  # no more heartbeats: ackWait runs out
        assert stolen.num_delivered == 2
        await stolen.ack()


async def test_delivery_limit_marks_last_attempt_then_exhaustion(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server_module.url, nats_config.model_copy(update={"max_deliver": 3}))
    await log.publish(sealer.seal_assignment(make_assignment()))
    seen = []
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        while True:
            d = await next_delivery(it)
            seen.append((d.num_delivered, d.is_last_attempt, d.exhausted))
            if d.exhausted:
                await d.term()  # the launcher finalized the task failed
                break
            await d.nak()
    assert seen == [(1, False, False), (2, False, False), (3, True, False), (4, True, True)]
    assert await log.pending("pod") == 0
    assert await stream_messages(log) == 0


async def test_pending_counts_waiting_and_in_flight_per_pool(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server_module.url, nats_config, pools=("pod", "vm"))
    for _ in range(3):
        await log.publish(sealer.seal_assignment(make_assignment(pool="pod")))
    vm = make_assignment(pool="vm")
    await log.publish(sealer.seal_assignment(vm))
    assert (await log.pending("pod"), await log.pending("vm")) == (3, 1)
    async with contextlib.aclosing(log.deliveries("vm")) as it:
        d = await next_delivery(it)
        assert d.assignment.assignment_id == vm.assignment_id
        assert await log.pending("vm") == 1  # delivered, not acknowledged
        await d.ack()
    async with contextlib.aclosing(log.deliveries("pod", batch=2)) as it:
        d = await next_delivery(it)
        assert d.assignment.pool == "pod"
        await d.ack()
    assert (await log.pending("pod"), await log.pending("vm")) == (2, 0)


async def test_one_pull_takes_what_the_caller_can_launch_and_gives_back_the_rest(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    """`batch` is read at every pull; deliveries pulled but not handed out when the generator
    closes are nak'ed, so the next launcher gets them at once instead of after ack-wait."""
    log = await open_log(nats_server_module.url, nats_config)
    published = [make_assignment() for _ in range(3)]
    for a in published:
        await log.publish(sealer.seal_assignment(a))
    asked: list[int] = []

    def batch() -> int:
        asked.append(3)
        return 3

    async with contextlib.aclosing(log.deliveries("pod", batch=batch)) as it:
        first = await next_delivery(it)
        await first.ack()
    assert asked == [3]  # one pull took all three
    async with contextlib.aclosing(log.deliveries("pod", batch=2)) as again:
        rest = [await next_delivery(again, within=1.0) for _ in range(2)]
        for d in rest:
            assert d.num_delivered == 2
            await d.ack()
    ids = {first.assignment.assignment_id, *(d.assignment.assignment_id for d in rest)}
    assert ids == {a.assignment_id for a in published}
    assert await log.pending("pod") == 0


async def test_unauthenticated_messages_are_refused_and_newer_envelopes_left_alone(
    nats_server_module: NatsServer,
    nats_config: NatsConfig,
    open_log: LogFactory,
    sealer: Sealer,
    metrics: Metrics,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Garbage, and an assignment in the previous format (only its secrets sealed, its workflow
    forgeable), are dropped, logged and counted; a newer envelope waits for a newer controller."""
    log = await open_log(nats_server_module.url, nats_config)
    subject = log.subject("pod")
    await log.js.publish(subject, b"\xff\xfe not protobuf")
    previous, _ = split_secrets(make_assignment())
    previous = previous.replace(sealed=Sealed(key_id=sealer.key_id, nonce=bytes(12), ciphertext=b"secrets"))
    await log.js.publish(subject, encode(previous))
    sealed = sealer.seal_assignment(make_assignment())
    newer = dataclasses.replace(sealed.header, format=2)
    await log.js.publish(
        subject, encode_sealed(dataclasses.replace(sealed, header=newer, header_bytes=newer.to_bytes()))
    )
    good = make_assignment()
    await log.publish(sealer.seal_assignment(good))
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        d = await next_delivery(it)
        assert d.assignment.assignment_id == good.assignment_id
        await d.ack()
    assert metrics.sample("dynrunner_errors_total", pool="pod", kind="unreadable_assignment") == 2
    assert metrics.sample("dynrunner_assignments_refused_total", pool="pod", reason="unauthenticated") == 2
    assert "an assignment in the previous format, whose workflow and settings are not authenticated" in caplog.text
    assert await stream_messages(log) == 1  # the format-2 envelope waits for a newer controller


async def test_a_pull_that_times_out_with_asyncios_timeout_error_is_just_retried(
    nats_server_module: NatsServer,
    nats_config: NatsConfig,
    open_log: LogFactory,
    sealer: Sealer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nats-py's fetch raises the builtin TimeoutError (not its own subclass) on some paths;
    an idle pull that ends that way is no error of the launcher."""
    log = await open_log(nats_server_module.url, nats_config)
    real_fetch = JetStreamContext.PullSubscription.fetch
    timeouts = [TimeoutError()]

    async def fetch(self: JetStreamContext.PullSubscription, *args: object, **kwargs: object) -> list[Msg]:
        if timeouts:
            raise timeouts.pop()
        return await real_fetch(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", fetch)
    a = make_assignment()
    await log.publish(sealer.seal_assignment(a))
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        d = await next_delivery(it)
        assert d.assignment.assignment_id == a.assignment_id
        await d.ack()
    assert not timeouts


async def test_setup_is_idempotent_and_applies_changes(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    first = await open_log(nats_server_module.url, nats_config)
    await first.publish(sealer.seal_assignment(make_assignment()))
    same = await open_log(nats_server_module.url, nats_config)
    assert await same.pending("pod") == 1
    changed_cfg = nats_config.model_copy(
        update={"ack_wait_s": 7.0, "max_message_bytes": 2 * 1024 * 1024, "duplicate_window_s": 600.0}
    )
    changed = await open_log(nats_server_module.url, changed_cfg, pools=("pod", "vm"))
    stream = await changed.js.stream_info(nats_config.stream)
    assert stream.config.max_msg_size == 2 * 1024 * 1024 and stream.config.duplicate_window == 600
    assert stream.config.retention == RetentionPolicy.WORK_QUEUE and stream.state.messages == 1
    consumers = {c.name: c for c in await changed.js.consumers_info(nats_config.stream)}
    assert set(consumers) == {"launcher-pod", "launcher-vm"}
    assert consumers["launcher-pod"].config.ack_wait == 7.0
    assert consumers["launcher-pod"].config.filter_subject == f"{nats_config.subject_prefix}.pod"


async def test_a_deleted_consumer_is_recreated_while_launchers_pull(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer, metrics: Metrics
) -> None:
    log = await open_log(nats_server_module.url, nats_config)
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        waiting = asyncio.create_task(next_delivery(it, within=20))
        await asyncio.sleep(0.2)
        await log.js.delete_consumer(nats_config.stream, "launcher-pod")
        a = make_assignment()
        await log.publish(sealer.seal_assignment(a))
        d = await waiting
        assert d.assignment.assignment_id == a.assignment_id
        await d.ack()
    assert (metrics.sample("dynrunner_errors_total", pool="pod", kind="nats") or 0) >= 1


async def test_a_stream_with_other_retention_is_refused_with_advice(
    nats_server_module: NatsServer, nats_config: NatsConfig, open_log: LogFactory
) -> None:
    nc = await nats.connect(nats_server_module.url)
    try:
        await nc.jetstream().add_stream(
            StreamConfig(name=nats_config.stream, subjects=[f"{nats_config.subject_prefix}.*"])
        )
    finally:
        await nc.close()
    with pytest.raises(AssignmentLogError, match=r"retention=limits .* cannot be changed in place: drain it"):
        await open_log(nats_server_module.url, nats_config)


async def test_a_server_smaller_than_max_message_bytes_is_reported(
    nats_server_module: NatsServer,
    nats_config: NatsConfig,
    open_log: LogFactory,
    sealer: Sealer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = await open_log(nats_server_module.url, nats_config)  # the test server keeps NATS' 1 MiB default
    assert "accepts messages up to 1048576 bytes (its max_payload), less than nats.maxMessageBytes" in caplog.text
    big = make_assignment().replace(task=Task(id=1, workflow_payload=b"x" * (1024 * 1024 + 1)))
    with pytest.raises(PublishError, match="MaxPayloadError"):
        await log.publish(sealer.seal_assignment(big))


async def test_connect_to_nothing_is_a_clear_error(nats_config: NatsConfig) -> None:
    with pytest.raises(AssignmentLogError, match=r"cannot connect to NATS at nats://127.0.0.1:1: .*Connect call"):
        await AssignmentLog.connect("nats://127.0.0.1:1", nats_config, ["pod"], connect_wait_s=1)


async def test_publish_gives_up_with_publish_error_while_nats_is_down(
    nats_server: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer, metrics: Metrics
) -> None:
    cfg = nats_config.model_copy(update={"publish_timeout_s": 5.0})
    log = await open_log(nats_server.url, cfg)
    nats_server.stop()
    started = time.monotonic()
    async with asyncio.timeout(cfg.publish_timeout_s + 10):  # guards against a hang only
        with pytest.raises(PublishError, match=r"JetStream did not accept the assignment within 5s"):
            await log.publish(sealer.seal_assignment(make_assignment()))
    retries = metrics.sample("dynrunner_publish_retries_total", pool="pod") or 0
    print(f"PublishError after {time.monotonic() - started:.2f}s and {retries:.0f} retries (publishTimeoutSeconds 5)")
    assert retries >= 1
    nats_server.start()
    assert await log.pending("pod") == 0  # nothing was buffered to be stored after the give-up


async def test_publish_retries_across_a_nats_restart(
    nats_server: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server.url, nats_config.model_copy(update={"publish_timeout_s": 20.0}))
    nats_server.stop()
    publishing = asyncio.create_task(log.publish(sealer.seal_assignment(make_assignment())))
    await asyncio.sleep(0.5)
    assert not publishing.done()
    nats_server.start()
    await asyncio.wait_for(publishing, 25)
    assert await log.pending("pod") == 1


async def test_stream_and_consumer_state_survive_a_nats_restart(
    nats_server: NatsServer, nats_config: NatsConfig, open_log: LogFactory, sealer: Sealer
) -> None:
    log = await open_log(nats_server.url, nats_config.model_copy(update={"ack_wait_s": 2.0}))
    taken, waiting = make_assignment(task_id=1), make_assignment(task_id=2)
    await log.publish(sealer.seal_assignment(taken))
    await log.publish(sealer.seal_assignment(waiting))
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        d = await next_delivery(it)
        assert d.assignment.assignment_id == taken.assignment_id
    nats_server.restart()  # same data directory and port
    got = {}
    async with contextlib.aclosing(log.deliveries("pod")) as it:
        for _ in range(2):
            d = await next_delivery(it, within=20)
            got[d.assignment.assignment_id] = d.num_delivered
            await d.ack()
    assert got == {taken.assignment_id: 2, waiting.assignment_id: 1}
    again = await log.publish(sealer.seal_assignment(taken))  # the dedupe window survived too
    assert again > 0 and await log.pending("pod") == 0
