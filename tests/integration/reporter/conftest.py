"""Claiming a task from the Gitea double with an ephemeral runner, over a recording wire."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pyqwest
import pytest

from dynrunner.doubles.gitea import GiteaDouble, RunView
from dynrunner.proto.gitea import GiteaClient, RunnerCredentials, RunnerInfo, Task
from dynrunner.proto.masking import Masker
from tests.integration.reporter.wire import FaultyWire

LABELS = ["self-hosted", "pod"]


def workflow(steps: int) -> str:
    lines = ["name: ci", "on: push", "jobs:", "  build:", "    runs-on: [self-hosted, pod]", "    steps:"]
    lines += [f"      - name: step {i}\n        run: echo {i}" for i in range(steps)]
    return "\n".join(lines) + "\n"


@dataclass
class Claimed:
    """A task claimed by a fresh ephemeral runner, as the controller hands it over."""

    gitea: GiteaDouble
    wire: FaultyWire
    client: GiteaClient  # holds the ephemeral runner's credentials; talks over `wire`
    runner: RunnerInfo
    run: RunView
    task: Task

    def masker(self) -> Masker:
        """The values the engine registers: every secret, the task and runtime tokens."""
        context = self.task.context or {}
        return Masker([*self.task.secrets.values(), context["token"], context["gitea_runtime_token"]])


ClaimTask = Callable[..., Awaitable[Claimed]]


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
