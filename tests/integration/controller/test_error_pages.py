"""A front end that replaces Gitea's 5xx bodies with its own page (issue 10, item 9).

Gitea answers every failure as an HTTP 500 whose Connect body says what went wrong; nginx's
`proxy_intercept_errors` (or a CDN's error pages) swaps that body for an HTML page, so
"unregistered runner" looks like any passing failure. A claim loop whose armed runner an admin
deleted then retried forever and never armed another. Now, after a few such pages in a row it
asks with Ping and Declare, and arms a new runner when Gitea answers Ping but not Declare.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.gitea.errors import NOT_EXIST, internal
from tests.fixtures.faults import fault_proxy
from tests.fixtures.harness import build_config, in_process, live_runners, wait_for, wait_run_done

FETCH = "/api/actions/runner.v1.RunnerService/FetchTask"
WORKFLOW = "on: push\njobs:\n  build:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: echo hi\n"


@pytest.mark.parametrize("gitea_profile", ["1.26"])
async def test_a_deleted_runner_behind_a_front_end_that_rewrites_errors_is_replaced(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with fault_proxy(gitea.url, intercept_errors=True) as proxy:
        cfg = build_config(
            gitea_url=proxy.url,
            registration_token=gitea.registration_token,
            state_dir=tmp_path / "state",
            nats_url=nats_url,
        )
        with caplog.at_level(logging.WARNING, logger="dynrunner.controller.claiming.registrations"):
            async with in_process(cfg):
                armed = await wait_for(lambda: len(live_runners(gitea)) == 2 and live_runners(gitea), what="armed")
                for runner in armed:
                    gitea.delete_runner(runner.id)  # an admin cleans up the runner list
                run = gitea.submit("owner/repo", WORKFLOW)
                done = await wait_run_done(gitea, run.id, within=30)
                assert done.status == "success"
        assert proxy.intercepted[FETCH] >= 3  # what the loops saw instead of "unregistered runner"
    warnings = [r.getMessage() for r in caplog.records if "replaces Gitea's error bodies" in r.getMessage()]
    assert warnings, "the log does not say what the front end does"
    assert "docs/operations.md" in warnings[0]
    assert {r.id for r in armed}.isdisjoint(r.id for r in live_runners(gitea))


@pytest.mark.parametrize("gitea_profile", ["1.26"])
async def test_a_runner_gitea_still_knows_is_kept_through_error_pages(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FetchTask failing for everyone (go-gitea/gitea#37586: one broken job fails every pick)
    behind the same front end: Declare still answers, so the armed runners stay."""
    async with fault_proxy(gitea.url, intercept_errors=True) as proxy:
        cfg = build_config(
            gitea_url=proxy.url,
            registration_token=gitea.registration_token,
            state_dir=tmp_path / "state",
            nats_url=nats_url,
        )
        async with in_process(cfg):
            armed = await wait_for(lambda: len(live_runners(gitea)) == 2 and live_runners(gitea), what="armed")

            def broken(*args: Any, **kwargs: Any) -> Any:
                raise internal(f"pick task: CreateTaskForRunner: run with id 7217: {NOT_EXIST}")

            monkeypatch.setattr(gitea.engine, "pick", broken)
            await wait_for(lambda: proxy.intercepted[FETCH] >= 12, what="error pages", within=30)
            assert [r.id for r in live_runners(gitea)] == [r.id for r in armed]
            monkeypatch.undo()
            run = gitea.submit("owner/repo", WORKFLOW)
            assert (await wait_run_done(gitea, run.id, within=30)).status == "success"
