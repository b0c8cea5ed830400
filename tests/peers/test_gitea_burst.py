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

from tests.fixtures.peers import GITEA_LINES, built, why_not_built
from tests.fixtures.real_gitea import RealGitea, running_gitea
from tests.fixtures.real_gitea_burst import ZOMBIE, burst, check

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
JOBS = 40


@pytest.fixture(params=GITEA_LINES, ids=[f"gitea-{line}" for line in GITEA_LINES])
def own_gitea(request: pytest.FixtureRequest) -> Iterator[RealGitea]:
    """A Gitea of its own: the test kills it."""
    peer = built("gitea", request.param)
    if peer is None:
        pytest.skip(why_not_built("gitea", request.param))
    with running_gitea(peer, zombie_timeout=ZOMBIE) as gitea:
        yield gitea


async def test_two_controllers_and_a_killed_gitea_end_every_job_once(own_gitea: RealGitea, tmp_path: Path) -> None:
    result = await burst(own_gitea, tmp_path, JOBS)
    print(f"\nGitea {own_gitea.version}: {result.summary()}")
    problems = check(result)
    assert not problems, "\n".join(problems) + f"\n{result.summary()}"
