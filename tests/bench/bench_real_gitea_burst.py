"""Two controllers on one queue of 200 jobs on real Gitea, killed with SIGKILL mid-burst and
restarted on its database (tests/fixtures/real_gitea_burst.py; the tier runs 40 per release,
tests/peers/test_gitea_burst.py). Asserts what the tier asserts, prints the figures.

    nice -n 10 .venv/bin/python -m pytest -q -s tests/bench/bench_real_gitea_burst.py
Environment: DYNRUNNER_BENCH_JOBS (200, a multiple of ten), DYNRUNNER_BENCH_GITEA (every built
release, e.g. "1.26").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.peers import GITEA_LINES
from tests.fixtures.real_gitea import RealGitea
from tests.fixtures.real_gitea_burst import burst_ends_every_job_once, gitea_of_its_own

JOBS = int(os.environ.get("DYNRUNNER_BENCH_JOBS", "200"))
LINES = [line for line in GITEA_LINES if line in os.environ.get("DYNRUNNER_BENCH_GITEA", line)]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(params=LINES, ids=[f"gitea-{line}" for line in LINES])
def own_gitea(request: pytest.FixtureRequest) -> Iterator[RealGitea]:
    with gitea_of_its_own(request.param) as gitea:
        yield gitea


async def test_a_burst_over_two_controllers_and_a_killed_gitea(own_gitea: RealGitea, tmp_path: Path) -> None:
    await burst_ends_every_job_once(own_gitea, tmp_path, JOBS, within=3000)
