"""Tasks the controller cannot turn into an assignment as Gitea sent them: each is finalized
failed (or run with a bounded deadline), with the reason in its log, and nothing else is affected."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import build_config, in_process, wait_for, wait_run_done

OK = """
on: push
jobs:
  ok:
    runs-on: [self-hosted, local]
    steps:
      - run: echo hi
"""


def with_timeout(value: str) -> str:
    return OK.replace("  ok:\n", f"  big:\n    timeout-minutes: {value}\n")


@pytest.mark.parametrize("value", ["99999999999999999999", "1e300", ".inf"])
async def test_a_huge_timeout_minutes_still_runs_the_job(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, value: str
) -> None:
    """The deadline is bounded instead of overflowing: the claimed job is launched, not lost."""
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    async with in_process(cfg) as running:
        big = gitea.submit("owner/repo", with_timeout(value))
        ok = gitea.submit("owner/repo", OK)
        done = await wait_run_done(gitea, big.id, within=15)
        assert done.status == "success", "\n".join(gitea.task(done.jobs[0].task_id).log_rows)
        assert (await wait_run_done(gitea, ok.id, within=15)).status == "success"
        pool = running.controller.pools["local"]
        await wait_for(lambda: pool.capacity.in_use == 0, what="capacity released")


async def test_an_unexpected_error_while_building_the_assignment_finalizes_the_task(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claimed task is never dropped: whatever goes wrong before it is queued ends it failed."""
    from dynrunner.controller.claiming import claimer

    real = claimer.build_assignment

    def broken(task, **kwargs):  # type: ignore[no-untyped-def]
        if task.context_get("job") == "big":
            raise RuntimeError("something nobody expected")
        return real(task, **kwargs)

    monkeypatch.setattr(claimer, "build_assignment", broken)
    cfg = build_config(
        gitea_url=gitea.url, registration_token=gitea.registration_token, state_dir=tmp_path / "s", nats_url=nats_url
    )
    async with in_process(cfg) as running:
        bad = gitea.submit("owner/repo", with_timeout("5"))
        ok = gitea.submit("owner/repo", OK)
        done = await wait_run_done(gitea, bad.id, within=15)
        assert done.status == "failure"
        view = gitea.task(done.jobs[0].task_id)
        assert any("something nobody expected" in row for row in view.log_rows), view.log_rows
        assert view.log_archived
        assert (await wait_run_done(gitea, ok.id, within=15)).status == "success"
        pool = running.controller.pools["local"]
        await wait_for(lambda: pool.capacity.in_use == 0, what="capacity released")
