"""Reusable workflows through the whole product: the controller claims the calling job from
the Gitea double (a `uses:` job has no labels, so the pool's runner takes it, as Gitea 1.24–1.26
hand it to any runner), the local backend runs the real executor, which fetches the called
workflows from the double's git server with the task token — one of the run's own repository,
one of another (public) repository at a tag — and runs their jobs inside the calling job's
task. Inputs are typed, a secret passed explicitly and one inherited are masked in the stored
log, and the called workflow's outputs reach a later job of the run through Gitea."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.gitea import GiteaFactory
from tests.fixtures.harness import in_process, real_executor_config, wait_run_done
from tests.fixtures.reusable_workflows import BUILD, NOTIFY, PIPELINE_SECRETS, pipeline


async def test_local_and_remote_reusable_workflows_with_inputs_secrets_and_outputs(
    gitea_factory: GiteaFactory, nats_url: str, tmp_path: Path
) -> None:
    async with gitea_factory() as gitea:
        gitea.create_repository("owner/app", private=True)
        gitea.commit("owner/app", {".gitea/workflows/build.yml": BUILD})
        gitea.create_repository("shared/ci")
        gitea.commit("shared/ci", {".gitea/workflows/notify.yml": NOTIFY}, tags=["v1"])
        async with in_process(real_executor_config(gitea, nats_url, tmp_path / "state")):
            run = gitea.submit(
                "owner/app", pipeline("shared/ci/.gitea/workflows/notify.yml@v1"), secrets=PIPELINE_SECRETS
            )
            done = await wait_run_done(gitea, run.id, within=120)
        build, notify, report = (gitea.task(job.task_id) for job in done.jobs)
    logs = [task.log_rows for task in (build, notify, report)]
    assert done.status == "success", "\n\n".join("\n".join(rows) for rows in logs)
    assert "building app at level 3, strip=true" in build.log_rows
    assert "signing with ***" in build.log_rows
    assert build.outputs == {"artifact": "app-3.tar"}
    assert "notifying about app-3.tar with ***" in notify.log_rows
    assert notify.outputs == {"sent": "yes"}
    assert "artifact app-3.tar, notified yes" in report.log_rows
    assert build.steps == [] and notify.steps == []  # Gitea has no step rows for a calling job
    stored = "\n".join("\n".join(rows) for rows in logs)
    assert "k3y-s3cret" not in stored and "t0ken" not in stored
