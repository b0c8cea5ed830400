"""Claiming a task from the Gitea double with an ephemeral runner, over a recording wire."""

from __future__ import annotations

from collections.abc import Callable

import pyqwest
import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient, RunnerCredentials
from tests.fixtures.reporter_claims import Claimed, ClaimTask
from tests.fixtures.reporter_wire import FaultyWire

LABELS = ["self-hosted", "pod"]


def workflow(steps: int) -> str:
    lines = ["name: ci", "on: push", "jobs:", "  build:", "    runs-on: [self-hosted, pod]", "    steps:"]
    lines += [f"      - name: step {i}\n        run: echo {i}" for i in range(steps)]
    return "\n".join(lines) + "\n"


def make_claim(gitea: GiteaDouble) -> ClaimTask:
    async def claim_task(
        steps: int = 2,
        secrets: dict[str, str] | None = None,
        wire: FaultyWire | None = None,
        capabilities: tuple[str, ...] = (),
    ) -> Claimed:
        wire = wire or FaultyWire()
        base = GiteaClient(gitea.url, http_client=pyqwest.Client(wire))
        runner = await base.register(
            name="ephemeral",
            registration_token=gitea.registration_token,
            labels=LABELS,
            ephemeral=True,
            capabilities=capabilities,
        )
        client = base.with_credentials(RunnerCredentials(runner.uuid, runner.token))
        run = gitea.submit("owner/repo", workflow(steps), secrets=secrets or {})
        fetched = await client.fetch_task(0)
        assert fetched.task is not None
        return Claimed(gitea, wire, client, runner, run, fetched.task)

    return claim_task


@pytest.fixture
def claim(gitea: GiteaDouble) -> ClaimTask:
    """Claim a task of a new run from the `gitea` fixture's double."""
    return make_claim(gitea)


@pytest.fixture
def claim_factory() -> Callable[[GiteaDouble], ClaimTask]:
    """`claim` for a double of your own (e.g. one started with `gitea_factory`)."""
    return make_claim
