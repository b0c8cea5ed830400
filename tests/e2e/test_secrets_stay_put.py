"""Where secrets go, end to end (real executor, real nats-server, local backend).

The registration token may register runners; it never leaves the controller: not onto NATS,
not into an environment's files, not into the executor's or a step's environment, not into
the job log. Task secrets and tokens cross NATS only sealed, and reach the log only masked.
"""

from __future__ import annotations

from pathlib import Path

import nats

from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.harness import in_process, real_executor_config, wait_for, wait_run_done

SECRET = "hunter2-correct-horse-battery"

WORKFLOW = """
on: push
jobs:
  snoop:
    runs-on: [self-hosted, local]
    steps:
      - name: what a step can see
        env:
          DEPLOY_KEY: ${{ secrets.DEPLOY_KEY }}
        run: |
          env | sort
          echo "--- executor environment"
          tr '\\0' '\\n' < /proc/$PPID/environ | sort
          echo "key=$DEPLOY_KEY"
      - name: hold
        run: |
          echo "holding"
          for _ in $(seq 300); do [ -e go ] && exit 0; sleep 0.1; done
          exit 1
"""


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


async def test_the_registration_token_never_leaves_the_controller(
    gitea: GiteaDouble, nats_url: str, tmp_path: Path
) -> None:
    registration = gitea.registration_token.encode()
    wire: list[bytes] = []
    tap = await nats.connect(nats_url)

    async def record(msg: nats.aio.msg.Msg) -> None:
        wire.append(msg.subject.encode() + b" " + repr(msg.headers).encode() + b" " + msg.data)

    await tap.subscribe(">", cb=record)
    cfg = real_executor_config(gitea, nats_url, tmp_path / "state")
    root = cfg.pools[0].backend.root_dir
    assert root is not None
    try:
        async with in_process(cfg):
            run = gitea.submit("acme/app", WORKFLOW, secrets={"DEPLOY_KEY": SECRET})
            job = await wait_for(lambda: (j := gitea.jobs(run.id)[0]).task_id and j, what="claim")
            await wait_for(lambda: "holding" in gitea.task(job.task_id).log_rows, what="the job to hold")
            # While the job runs: everything its environment holds on disk.
            assert files_containing(root, registration) == []
            [workspace] = [p for p in root.rglob("workspace") if (p / "acme" / "app").is_dir()]
            (workspace / "acme" / "app" / "go").touch()
            done = await wait_run_done(gitea, run.id)
            task = gitea.task(job.task_id)
        await tap.flush()
    finally:
        await tap.close()

    log = "\n".join(task.log_rows)
    assert done.status == "success", log
    assert "--- executor environment" in log and "key=***" in log
    assert gitea.registration_token not in log
    assert SECRET not in log and task.token not in log
    names = {row.split("=", 1)[0] for row in task.log_rows if "=" in row}
    # The executor gets one setting of ours, its steps another; the controller's own
    # environment (and its working directory) reaches neither.
    assert {n for n in names if n.startswith("DYNRUNNER_")} == {
        "DYNRUNNER_READY_FILE",
        "DYNRUNNER_STATE_FILE",
        "DYNRUNNER_RUNTIME_DIR",
    }
    assert "OLDPWD" not in names
    assert wire, "the tap saw no NATS traffic"
    for needle in (registration, SECRET.encode(), task.token.encode()):
        assert not any(needle in message for message in wire), f"{needle!r} crossed NATS in clear"
