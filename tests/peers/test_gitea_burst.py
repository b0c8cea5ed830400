"""Two controllers on one queue of a real Gitea 1.24, 1.25 and 1.26, Gitea killed with SIGKILL
mid-burst and restarted on its database (scenario: tests/fixtures/real_gitea_burst.py).

40 jobs here, to keep the tier's time on two cores; `make bench` runs the same scenario with
200 (tests/bench/bench_real_gitea_burst.py). Every job must run and end once, successfully;
nothing may be left: environments, permits, and in Gitea (the admin API) only the armed
runners of the four claim loops.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.peers import GITEA_LINES
from tests.fixtures.real_gitea import RealGitea
from tests.fixtures.real_gitea_burst import burst_ends_every_job_once, gitea_of_its_own

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
JOBS = 40


@pytest.fixture(params=GITEA_LINES, ids=[f"gitea-{line}" for line in GITEA_LINES])
def own_gitea(request: pytest.FixtureRequest) -> Iterator[RealGitea]:
    """A Gitea of its own: the test kills it."""
    with gitea_of_its_own(request.param) as gitea:
        yield gitea


async def test_two_controllers_and_a_killed_gitea_end_every_job_once(own_gitea: RealGitea, tmp_path: Path) -> None:
    await burst_ends_every_job_once(own_gitea, tmp_path, JOBS)
