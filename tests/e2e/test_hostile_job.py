"""A hostile job, end to end (Gitea double, embedded NATS, local backend, real executor).

Under `runAsUser` it tries to read what a job must never have — the sealing key, the
registration token, the configuration, the NATS store and credentials, another running
job's assignment, workspace and processes — and every attempt fails, though all of those
files are readable by anyone on the host: the job's namespaces keep it from them. Without
runAsUser the same job reads them, and the controller said so when it started.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from shlex import quote
from typing import Any

import pytest
import yaml

from dynrunner.controller.backends.local.layout import Layout
from dynrunner.controller.config.model import ControllerConfig, load_config
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import config_data, in_process, wait_for, wait_run_done
from tests.fixtures.local_backend import NOBODY
from tests.fixtures.privileges import is_root, needs_root

B_SECRET = "b-secret-correct-horse-battery"

HOLDING_JOB = {
    "on": "push",
    "jobs": {
        "victim": {
            "runs-on": ["self-hosted", "local"],
            "steps": [
                {
                    "env": {"B_TOKEN": "${{ secrets.B_TOKEN }}"},
                    "run": 'echo "$B_TOKEN" > b-secret.txt\necho holding\n'
                    "for _ in $(seq 1200); do [ -e go ] && exit 0; sleep 0.05; done; exit 1",
                }
            ],
        }
    },
}


def quoted(paths: list[Path]) -> list[str]:
    return [quote(str(p)) for p in paths]


def hostile_job(targets: list[Path], listings: list[Path]) -> str:
    reads = "\n".join(
        f"if cat {q} > /dev/null 2>&1; then echo LEAKED {q}; else echo denied {q}; fi" for q in quoted(targets)
    )
    # What it sees of a directory: the names in it (of the job roots, at most its own path).
    lists = "\n".join(f'echo "LIST {p}: $(ls -A {quote(str(p))} 2>&1 | tr "\\n" " ")"' for p in listings)
    snoop = (
        # every process this job can see: none of the controller's, none of the other job's
        "for p in /proc/[0-9]*; do\n"
        '  { tr "\\0" "\\n" < "$p/environ"; tr "\\0" " " < "$p/cmdline"; echo; } 2> /dev/null || true\n'
        "done > seen.txt\n"
        'if grep -q "B_TOKEN\\|dynrunner-controller\\|pytest" seen.txt; then echo "LEAKED processes"; '
        'else echo "denied processes"; fi\n'
        'echo "uid $(id -u)"\n'
        'if sudo -n true 2> /dev/null; then echo "LEAKED root"; else echo "denied root"; fi'
    )
    job = {"runs-on": ["self-hosted", "local"], "steps": [{"run": reads}, {"run": lists}, {"run": snoop}]}
    return yaml.safe_dump({"on": "push", "jobs": {"hostile": job}})


def configure(gitea: GiteaDouble, host: Path, backend: dict[str, Any], programs: Path) -> ControllerConfig:
    """A configuration file and a token file as an admin might leave them: readable by anyone."""
    token = host / "registration-token"
    token.write_text(gitea.registration_token + "\n")
    data = config_data(
        gitea_url=gitea.url,
        registration_token=gitea.registration_token,
        state_dir=host / "state",
        nats_url=None,
        executor_command=[str(programs / "dynrunner-executor")],
        max_concurrency=2,
    )
    del data["gitea"]["registrationToken"]
    data["gitea"]["registrationTokenFile"] = str(token)
    data["pools"][0]["backend"].update(backend)
    path = host / "controller.yaml"
    path.write_text(yaml.safe_dump(data))
    for public in (token, path, host / "state" / "sealing.key"):
        public.chmod(0o644)
    return load_config(path)


async def attack(gitea: GiteaDouble, cfg: ControllerConfig) -> tuple[str, list[str]]:
    """Run the victim, then the hostile job while the victim holds; the hostile job's log
    and the secrets it must not have seen."""
    root = cfg.pools[0].backend.root_dir
    assert root is not None and cfg.source_file is not None and cfg.gitea.registration_token_file is not None
    victim = gitea.submit("other/private", HOLDING_JOB, secrets={"B_TOKEN": B_SECRET})
    job = await wait_for(lambda: (j := gitea.jobs(victim.id)[0]).task_id and j, what="victim claimed")
    await wait_for(lambda: "holding" in gitea.task(job.task_id).log_rows, what="the victim to hold")
    [victim_dir] = [p for p in root.iterdir() if not p.name.startswith(".")]
    b = Layout(victim_dir)
    [b_secret_file] = b.workspace.rglob("b-secret.txt")
    state = cfg.state_dir
    nats_files = [p for p in (state / "nats").rglob("*") if p.is_file()]
    credentials = state / "nats" / "client-credentials.json"
    assert credentials in nats_files, "the embedded NATS keeps its credentials, store and settings in the state"
    targets = [
        cfg.sealing.key_file,
        cfg.gitea.registration_token_file,
        cfg.source_file,
        *nats_files,
        b.assignment_file,
        b_secret_file,
        b.output,
    ]
    listings = [root, state, b.dir]
    attacker = gitea.submit("mallory/tools", hostile_job([p for p in targets if p is not None], listings))
    done = await wait_run_done(gitea, attacker.id)
    log = "\n".join(gitea.task(done.jobs[0].task_id).log_rows)
    assert done.status == "success", log
    (b_secret_file.parent / "go").touch()
    assert (await wait_run_done(gitea, victim.id)).status == "success"
    key = cfg.sealing.key_file.read_text().strip() if cfg.sealing.key_file else ""
    nats_password = json.loads(credentials.read_text())["password"]
    return log, [B_SECRET, gitea.registration_token, key, nats_password, gitea.task(job.task_id).token]


@needs_root("runAsUser runs the job as another user, in namespaces only root may make")
async def test_a_hostile_job_under_run_as_user_reads_nothing_it_must_not(
    gitea: GiteaDouble, host_dir: Path, installed_programs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = configure(gitea, host_dir, {"runAsUser": "nobody"}, installed_programs)
    caplog.set_level(logging.INFO)
    async with in_process(cfg):
        log, secrets = await attack(gitea, cfg)
    assert "jobs run as nobody (uid 65534, gid 65534) in mount, PID and IPC namespaces" in caplog.text
    assert "are not isolated" not in caplog.text
    verdicts = [row.split(" ", 1)[0] for row in log.splitlines() if row.startswith(("denied", "LEAKED", "LISTED"))]
    assert "uid 65534" in log
    assert verdicts and set(verdicts) == {"denied"}, log
    assert len(verdicts) >= 12, log
    root, state = cfg.pools[0].backend.root_dir, cfg.state_dir
    seen = {
        line.split(": ", 1)[0][len("LIST ") :]: line.split(": ", 1)[1].split()
        for line in log.splitlines()
        if line.startswith("LIST ")
    }
    assert seen[str(state)] == ["local"]  # the path to its own directory, nothing else of the state
    assert len(seen[str(root)]) == 1  # its own directory: not the victim's
    assert "No such file or directory" in " ".join(next(v for k, v in seen.items() if k not in (str(state), str(root))))
    for secret in secrets:
        assert secret and str(secret) not in log


async def test_without_run_as_user_the_same_job_reads_it_all_and_the_controller_said_so(
    gitea: GiteaDouble, host_dir: Path, installed_programs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = configure(gitea, host_dir, {}, installed_programs)
    caplog.set_level(logging.INFO)
    async with in_process(cfg):
        log, _ = await attack(gitea, cfg)
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "not isolated" in r.getMessage()
    ]
    assert len(warnings) == 1 and str(cfg.source_file) in warnings[0], warnings
    assert f"LEAKED {cfg.sealing.key_file}" in log and f"LEAKED {cfg.gitea.registration_token_file}" in log


def not_root(host: Path) -> tuple[int, list[str]]:
    """A user that is not root and the command prefix that runs a program as it: nobody, given
    `host`, when the suite runs as root; else the suite's own user, as it is."""
    if not is_root():
        return os.geteuid(), []
    for path in [host, *host.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    return NOBODY, ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


async def controller_command(prefix: list[str], programs: Path, *argv: str) -> tuple[int, str]:
    """A `dynrunner-controller` command run after `prefix` (without blocking the loop the
    Gitea double answers in)."""
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        str(programs / "dynrunner-controller"),
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={"PATH": os.defpath, "HOME": "/nonexistent"},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode()


async def test_a_controller_that_is_not_root_says_it_cannot_isolate_jobs(
    gitea: GiteaDouble, host_dir: Path, installed_programs: Path
) -> None:
    cfg = configure(gitea, host_dir, {}, installed_programs)
    uid, prefix = not_root(host_dir)
    assert cfg.source_file is not None
    code, out = await controller_command(prefix, installed_programs, "check", "--config", str(cfg.source_file))
    assert code == 0, out
    [warning] = [line for line in out.splitlines() if line.startswith("WARN pool local: ")]
    assert f"jobs run as the controller's own user (uid {uid}) and are not isolated from it" in warning
    assert "needs a controller running as root" in warning

    data = yaml.safe_load(cfg.source_file.read_text())
    data["pools"][0]["backend"]["runAsUser"] = "nobody"
    cfg.source_file.write_text(yaml.safe_dump(data))
    code, out = await controller_command(prefix, installed_programs, "check", "--config", str(cfg.source_file))
    assert code == 1 and "FAIL pool local: runAsUser needs the controller to run as root" in out, out
    code, out = await controller_command(prefix, installed_programs, "run", "--config", str(cfg.source_file))
    assert code == 1 and "runAsUser needs the controller to run as root" in out, out
    assert "Traceback" not in out
