"""Shared pieces for the controller infrastructure tests against a real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dynrunner.controller.assignments import AssignmentLog
from dynrunner.controller.config import NatsConfig
from dynrunner.controller.metrics import Metrics
from dynrunner.controller.sealing import Sealer
from tests.integration.controller.infra.samples import LogFactory


@pytest.fixture
def sealer() -> Sealer:
    return Sealer(bytes(range(32)))


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
async def open_log(metrics: Metrics) -> AsyncIterator[LogFactory]:
    """`await open_log(url, cfg, pools=("pod",))`; every log opened is closed at teardown."""
    opened: list[AssignmentLog] = []

    async def factory(url: str, cfg: NatsConfig, pools: tuple[str, ...] = ("pod",)) -> AssignmentLog:
        log = await AssignmentLog.connect(url, cfg, list(pools), metrics=metrics)
        opened.append(log)
        return log

    yield factory
    for log in opened:
        await log.close()
