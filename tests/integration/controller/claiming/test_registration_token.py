"""A registration token Gitea refuses (issue 14, item 8): one clear line, no endless retry,
`/readyz` says why, what runs keeps running, and a new token in the file resumes claiming."""

from __future__ import annotations

import asyncio
import io
import logging
import socket
from pathlib import Path

import pytest
import yaml

from dynrunner.controller.checks import run_checks
from dynrunner.controller.claiming import registration_token
from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import config_data, in_process, live_runners, wait_for, wait_run_done

ONE_JOB = "on: push\njobs:\n  a:\n    runs-on: [self-hosted, local]\n    steps: [{run: x}]\n"
REFUSED = "Gitea refused the registration token"


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(REFUSED)]


async def test_a_refused_token_stops_registering_until_the_file_holds_a_valid_one(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registration_token, "RECHECK_S", 0.2)
    token_file = tmp_path / "registration-token"
    token_file.write_text("0123456789abcdef0123456789abcdef01234567\n")  # no token of this Gitea
    data = config_data(gitea_url=gitea.url, registration_token="", state_dir=tmp_path / "state", nats_url=nats_url)
    data["gitea"].pop("registrationToken")
    data["gitea"]["registrationTokenFile"] = str(token_file)
    cfg = ControllerConfig.model_validate(data)
    async with in_process(cfg) as running:
        controller = running.controller
        metrics = controller.metrics
        await wait_for(lambda: refusals(caplog), what="the refusal")
        ready, reason = controller.readiness()
        assert not ready
        assert reason == (
            f"{REFUSED} (runner registration token not found); put a valid one (Gitea: Site Administration, or "
            "an organization's or repository's Settings → Actions → Runners → Create new runner) into "
            f"{token_file}; it is read again every 0.2 s"
        )
        await wait_for(lambda: metrics.sample("dynrunner_errors_total", pool="local", kind="register") == 2)
        caplog.clear()
        run = gitea.submit("owner/repo", ONE_JOB)
        await asyncio.sleep(1.0)  # five re-reads of the file: no Register with the refused token, no line
        assert metrics.sample("dynrunner_errors_total", pool="local", kind="register") == 2
        assert live_runners(gitea) == [] and refusals(caplog) == []

        token_file.write_text(gitea.registration_token + "\n")  # an admin puts the right one in
        assert (await wait_run_done(gitea, run.id, within=30)).status == "success"
        await wait_for(lambda: controller.readiness()[0], what="ready again")

        # An admin creates a new token in Gitea (the old one is invalidated): the next runner a
        # claim needs is refused; the job claimed already runs to its end and is reaped.
        gitea.new_registration_token()
        second = gitea.submit("owner/repo", ONE_JOB)
        assert (await wait_run_done(gitea, second.id, within=30)).status == "success"
        await wait_for(lambda: refusals(caplog), what="the refusal of the replaced token")
        assert "runner registration token has been invalidated" in controller.readiness()[1]
        pool = controller.pools["local"]
        await wait_for(lambda: pool.capacity.in_use == 0, what="the job reaped")
    assert len(refusals(caplog)) == 1, refusals(caplog)


@pytest.fixture(autouse=True)
def _log_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dynrunner.controller")


async def test_check_reports_the_refusal_of_a_running_controller_and_a_malformed_token(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = config_data(
        gitea_url=gitea.url,
        registration_token="f" * 40,
        state_dir=tmp_path / "state",
        nats_url=nats_url,
    )
    data["metrics"] = {"address": f"127.0.0.1:{port}"}
    config = tmp_path / "controller.yaml"
    config.write_text(yaml.safe_dump(data))
    out = io.StringIO()
    assert await run_checks(config, out) == 0
    assert f"OK   controller: none answers at http://127.0.0.1:{port}/readyz (not running here)" in out.getvalue()
    assert "OK   registration token: 40 characters (inline)" in out.getvalue()

    async with in_process(ControllerConfig.model_validate(data)) as running:
        await wait_for(lambda: running.controller.readiness()[1].startswith(REFUSED), what="the refusal")
        out = io.StringIO()
        assert await run_checks(config, out) == 1
    line = next(x for x in out.getvalue().splitlines() if x.startswith("FAIL controller: "))
    assert line.startswith(
        f"FAIL controller: running here and not ready: {REFUSED} (runner registration token not found)"
    )

    data["gitea"]["registrationToken"] = "my token"
    config.write_text(yaml.safe_dump(data))
    out = io.StringIO()
    assert await run_checks(config, out) == 1
    assert "FAIL registration token: the token (inline) has 8 characters and spaces: Gitea's registration tokens" in (
        out.getvalue()
    )
