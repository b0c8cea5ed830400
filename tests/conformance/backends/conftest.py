"""The suite runs once per backend in `tests.fixtures.conformance.DRIVERS`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fixtures.conformance import DRIVERS, ScenarioDriver, load_driver


@pytest.fixture(params=sorted(DRIVERS))
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[ScenarioDriver]:
    async with load_driver(request.param) as driver:
        yield driver
