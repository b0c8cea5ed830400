"""Assignment-log throughput: what the claim → publish → launch path costs in JetStream and sealing.

Against the embedded nats-server (file storage, fsync as configured by default):
  * embedded server start until JetStream is healthy;
  * seal and unseal of a realistic assignment (a ~4 KiB workflow, a ~16 KiB event context, secrets);
  * publish with PubAck, one at a time (how the claimer publishes) and N concurrently;
  * deliver + ack, one at a time (how a launcher pulls when it has one free slot);
  * registration store put + get.
Figures are printed, never asserted.

    .venv/bin/python tests/bench/bench_assignment_log.py
    .venv/bin/python -m pytest -q -s tests/bench/bench_assignment_log.py
DYNRUNNER_BENCH_N sets the number of assignments (default 1000).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from dynrunner.controller.assignments.launched import LaunchedRecord
from dynrunner.controller.assignments.log import AssignmentLog
from dynrunner.controller.claiming.registrations_store import ArmedRegistration, RegistrationStore
from dynrunner.controller.config.model import NatsConfig
from dynrunner.controller.infra.embedded_nats import EmbeddedNats
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.proto.assignment import Assignment, ClaimingRunner, encode, encode_sealed
from dynrunner.proto.gitea import Task


def assignment(pool: str = "pod") -> Assignment:
    context = {"token": "t" * 40, "gitea_runtime_token": "j" * 300, "event": {"commits": ["c" * 160] * 100}}
    return Assignment(
        assignment_id=str(uuid.uuid4()),
        pool=pool,
        backend="local",
        claimed_at=datetime.now(UTC),
        task=Task(
            id=1,
            workflow_payload=b"x" * 4096,
            context=context,
            secrets={f"S{i}": "v" * 64 for i in range(10)},
        ),
        runner=ClaimingRunner(id=1, uuid=str(uuid.uuid4()), token="r" * 40, name="dynrunner-pod-1"),
        gitea_url="http://gitea:3000",
        job_key="build",
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def line(what: str, n: int, seconds: float, per_op: list[float] | None = None) -> None:
    text = f"{what:<44} {n / seconds:10.0f}/s"
    if per_op:
        text += f"   p50 {pct(per_op, 0.5) * 1e3:7.2f} ms   p99 {pct(per_op, 0.99) * 1e3:7.2f} ms"
    print(text)


async def run(n: int) -> None:
    sealer = Sealer(os.urandom(32))
    sample = assignment()
    sealed_size = len(encode_sealed(sealer.seal_assignment(sample)))
    print(f"assignment: {len(encode(sample))} bytes encoded, {sealed_size} sealed")

    started = time.perf_counter()
    for _ in range(n):
        sealer.unseal_assignment(sealer.seal_assignment(sample))
    line("seal + unseal", n, time.perf_counter() - started)

    with tempfile.TemporaryDirectory() as tmp:
        starts = []
        for i in range(5):
            t = time.perf_counter()
            async with EmbeddedNats(Path(tmp) / f"start-{i}"):
                starts.append(time.perf_counter() - t)
        print(f"{'embedded nats-server start to healthy':<44} median {statistics.median(starts) * 1e3:.1f} ms")

        async with EmbeddedNats(Path(tmp) / "nats") as server:
            cfg = NatsConfig(ack_wait_s=30)
            log = await AssignmentLog.connect(server.url, cfg, ["pod"], options=server.client_options())
            try:
                sealed = [sealer.seal_assignment(assignment()) for _ in range(n)]
                lat = []
                started = time.perf_counter()
                for a in sealed:
                    t = time.perf_counter()
                    await log.publish(a)
                    lat.append(time.perf_counter() - t)
                line("publish, one at a time (PubAck each)", n, time.perf_counter() - started, lat)

                batch = [sealer.seal_assignment(assignment()) for _ in range(n)]
                started = time.perf_counter()
                await asyncio.gather(*(log.publish(a) for a in batch))
                line("publish, all concurrently", n, time.perf_counter() - started)

                lat = []
                started = time.perf_counter()
                async with contextlib.aclosing(log.deliveries("pod")) as it:
                    for _ in range(2 * n):
                        t = time.perf_counter()
                        d = await anext(it)
                        sealer.unseal_assignment(d.assignment)
                        await d.ack()
                        lat.append(time.perf_counter() - t)
                line("deliver + unseal + ack, one at a time", 2 * n, time.perf_counter() - started, lat)

                store = await RegistrationStore.open(log, sealer)
                reg = ArmedRegistration(1, "u", "tok", "n", ("self-hosted",), datetime.now(UTC))
                started = time.perf_counter()
                for _ in range(n // 4):
                    await store.put("pod", reg)
                    await store.get("pod")
                line("registration store put + get", n // 4, time.perf_counter() - started)

                record = await LaunchedRecord.open(log.js, cfg.launched_bucket)
                lat = []
                started = time.perf_counter()
                for i in range(n // 4):
                    t = time.perf_counter()
                    await record.begin(f"a-{i}", i)
                    await record.done(f"a-{i}", i)
                    lat.append(time.perf_counter() - t)
                line("launch record begin + done (per job)", n // 4, time.perf_counter() - started, lat)
            finally:
                await log.close()


def report() -> None:
    asyncio.run(run(int(os.environ.get("DYNRUNNER_BENCH_N", "1000"))))


def test_assignment_log_throughput() -> None:
    report()


if __name__ == "__main__":
    report()
