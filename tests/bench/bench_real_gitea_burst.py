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

from tests.fixtures.peers import GITEA_LINES, built, why_not_built
from tests.fixtures.real_gitea import RealGitea, running_gitea
from tests.fixtures.real_gitea_burst import ZOMBIE, burst, check

JOBS = int(os.environ.get("DYNRUNNER_BENCH_JOBS", "200"))
LINES = [line for line in GITEA_LINES if line in os.environ.get("DYNRUNNER_BENCH_GITEA", line)]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(params=LINES, ids=[f"gitea-{line}" for line in LINES])
def own_gitea(request: pytest.FixtureRequest) -> Iterator[RealGitea]:
    peer = built("gitea", request.param)
    if peer is None:
        pytest.skip(why_not_built("gitea", request.param))
    with running_gitea(peer, zombie_timeout=ZOMBIE) as gitea:
        yield gitea


async def test_a_burst_over_two_controllers_and_a_killed_gitea(own_gitea: RealGitea, tmp_path: Path) -> None:
    result = await burst(own_gitea, tmp_path, JOBS, within=3000)
    print(f"\nGitea {own_gitea.version}: {result.summary()}")
    problems = check(result)
    assert not problems, "\n".join(problems) + f"\n{result.summary()}"
