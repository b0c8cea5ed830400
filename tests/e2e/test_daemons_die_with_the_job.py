"""End to end (Gitea double, real nats-server, local backend, real executor): steps start
daemons that leave the job's process tree and drop its RUNNER_TRACKING_ID; none outlives
the job, and the controller says at start how it contains them."""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

import pytest
import yaml

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import in_process, real_executor_config, wait_for, wait_run_done
from tests.fixtures.local_backend import holding, sleepers


def workflow(marks: dict[str, int], sudo: bool) -> str:
    steps = [
        f"env -i /usr/bin/setsid /bin/sleep {marks['setsid']} > /dev/null 2>&1 &",
        f"env -u RUNNER_TRACKING_ID /bin/sh -c '/bin/sh -c \"/bin/sleep {marks['double fork']} > /dev/null 2>&1 &\" &'",
    ]
    if sudo:
        steps.append(f"sudo -u nobody /bin/sh -c '/bin/sleep {marks['sudo']} > /dev/null 2>&1 &'")
    steps.append('echo "holding"; for _ in $(seq 600); do [ -e go ] && exit 0; sleep 0.05; done; exit 1')
    job = {"runs-on": ["self-hosted", "local"], "steps": [{"run": step} for step in steps]}
    return yaml.safe_dump({"on": "push", "jobs": {"daemons": job}})


async def test_no_daemon_outlives_its_job(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sudo = shutil.which("sudo") is not None
    marks = {name: random.randrange(10**8, 10**9) for name in ("setsid", "double fork", "sudo")}
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state")
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    holding(root, cfg.pools[0].name)
    caplog.set_level(logging.INFO)
    async with in_process(cfg):
        assert "pool local: processes contained by " in caplog.text
        run = gitea.submit("acme/app", workflow(marks, sudo))
        job = await wait_for(lambda: (j := gitea.jobs(run.id)[0]).task_id and j, what="claim")
        await wait_for(lambda: "holding" in gitea.task(job.task_id).log_rows, what="the job to hold")
        started = {name: sleepers(n) for name, n in marks.items()}
        assert all(started[name] for name in ("setsid", "double fork")), started
        assert started["sudo"] or not sudo, started
        [workspace] = [p for p in root.rglob("app") if p.is_dir() and p.parent.name == "acme"]
        (workspace / "go").touch()
        done = await wait_run_done(gitea, run.id)
        assert done.status == "success", "\n".join(gitea.task(job.task_id).log_rows)
        await wait_for(lambda: not any(root.iterdir()), what="the environment deleted")
        await wait_for(
            lambda: not any(sleepers(n) for n in marks.values()), within=5, what="every daemon stopped with the job"
        )
