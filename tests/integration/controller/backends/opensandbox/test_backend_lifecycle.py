"""The `opensandbox` backend against the OpenSandbox double: a job's sandbox made once, its
delivery staged before `create` returns and started by `follow_start`, observed, deleted."""

from __future__ import annotations

import asyncio
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dynrunner.controller import contract
from dynrunner.controller.backends.base import FailureReason, Phase, StartEvent, StartStage
from dynrunner.controller.backends.opensandbox.backend import OpenSandboxBackend
from dynrunner.controller.reaping.reaper import failure_report
from dynrunner.doubles.opensandbox import CreateFailure, OpenSandboxDouble
from dynrunner.proto.assignment import decode
from dynrunner.proto.gitea import Result, StepState, TaskState
from tests.fixtures.opensandbox import VM_IMAGE, OpenSandboxFactory, vm_image
from tests.fixtures.opensandbox_backend import stand_in_image, vm_assignment, vm_backend

T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
RUN = """
    echo "executor: $*"
    cat "$3" > /dev/null
    sleep 600
"""


async def _start(backend: OpenSandboxBackend, env: object) -> list[StartEvent]:
    return [event async for event in backend.follow_start(env)]  # type: ignore[arg-type]


async def _phase(backend: OpenSandboxBackend, env: object, *phases: Phase, within: float = 20) -> object:
    async with asyncio.timeout(within):
        while True:
            obs = await backend.observe(env)  # type: ignore[arg-type]
            if obs.phase in phases:
                return obs
            await asyncio.sleep(0.05)


async def _console(box: object, text: str, within: float = 20) -> None:
    async with asyncio.timeout(within):
        while True:
            if text in box.console.read_text():  # type: ignore[attr-defined]
                return
            await asyncio.sleep(0.05)


async def test_create_stages_the_delivery_and_the_start_hands_it_over(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    image = stand_in_image(tmp_path, RUN)
    async with opensandbox_factory(images={VM_IMAGE: image}) as osb, vm_backend(osb, tmp_path) as backend:
        a = vm_assignment()
        env = await backend.create(a, stream_seq=11)
        assert env.name == contract.environment_name(a.assignment_id)
        assert dict(env.labels) == contract.environment_labels(a, 11)
        [box] = osb.listed()
        assert box.metadata["dynrunner-stage"] == "staged"
        assert box.metadata["dynrunner-assignment-id"] == a.assignment_id
        assert env.extra["sandbox"] == box.id and env.deadline is None
        partial = box.rootfs / "run/dynrunner/delivery.partial"
        handed = decode((partial / "assignment.pb").read_bytes())
        assert stat.S_IMODE((partial / "assignment.pb").stat().st_mode) == 0o600
        assert handed == a  # as the controller built it: the runner's credential is only in here
        assert sorted(p.name for p in partial.iterdir()) == ["assignment.pb"]  # no identity: no token
        for secret in ("runner-token", "s3cr3t", "tt"):
            assert secret not in str(box.metadata) and secret not in str(box.env)
        assert (await backend.observe(env)).phase is Phase.STARTING

        events = await _start(backend, env)
        assert [e.stage for e in events] == [StartStage.PROGRESS, StartStage.STARTING, StartStage.STARTED]
        assert "took" in events[0].line
        # The lines the job log shows name no sandbox: its id opens execd's proxy route.
        assert [e.line for e in events[:2] if box.id in e.line] == []
        assert osb.sandbox(box.id).metadata["dynrunner-stage"] == "delivered"
        assert (await _phase(backend, env, Phase.RUNNING)).phase is Phase.RUNNING  # type: ignore[attr-defined]
        await _console(box, "executor: run --assignment /run/dynrunner/delivery/assignment.pb")

        again = await _start(backend, env)
        assert [e.stage for e in again] == [StartStage.STARTED]
        await backend.delete(env)
        assert osb.listed() == [] and await backend.find(a.assignment_id) is None
        assert (await backend.observe(env)).phase is Phase.GONE


@pytest.mark.parametrize(
    ("body", "phase", "reason", "code"),
    [
        ("exit 0", Phase.SUCCEEDED, None, 0),
        ("exit 3", Phase.FAILED, FailureReason.EXECUTOR_FAILED, 3),
        ("kill -9 $$", Phase.FAILED, FailureReason.KILLED, 137),
    ],
)
async def test_how_the_executor_ended_is_the_observation(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path, body: str, phase: Phase, reason: object, code: int
) -> None:
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, body)}) as osb,
        vm_backend(osb, tmp_path) as backend,
    ):
        env = await backend.create(vm_assignment())
        await _start(backend, env)
        obs = await _phase(backend, env, Phase.SUCCEEDED, Phase.FAILED)
        assert obs.phase is phase  # type: ignore[attr-defined]
        assert (obs.diagnosis.reason if obs.diagnosis else None) is reason  # type: ignore[attr-defined]
        assert obs.exit_code == code  # type: ignore[attr-defined]
        # The console is read for a failed job only (its accepted state): none here kept one.
        assert backend.api.requests.get("console", 0) == (1 if phase is Phase.FAILED else 0)
        assert obs.reported is None  # type: ignore[attr-defined]


async def test_a_vm_ended_for_its_deadline_gives_the_steps_gitea_accepted_read_through_execd(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """Issue 18 item 7: the executor keeps its accepted state in the file the entrypoint names
    (`DYNRUNNER_STATE_FILE`); a job the controller ends while its VM still runs (its executor
    hung past the deadline) is observed with that state, read before the sandbox is deleted."""
    kept = TaskState(7, steps=[StepState(0, Result.SUCCESS, log_index=0, log_length=2), StepState(1, started_at=T0)])
    source = tmp_path / "kept.pb"
    source.write_bytes(kept.encode())
    body = f"""
        cp {source} "$DYNRUNNER_STATE_FILE"
        echo "kept in $DYNRUNNER_STATE_FILE"
        sleep 600
    """
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, body)}) as osb,
        vm_backend(osb, tmp_path) as backend,
    ):
        env = await backend.create(vm_assignment(deadline=osb.clock.now() + timedelta(minutes=1)))
        await _start(backend, env)
        [box] = osb.listed()
        await _console(box, "kept in /run/dynrunner/reported/accepted-state.pb")
        assert (await backend.observe(env)).reported is None  # running: nothing is read
        await osb.advance(180)
        obs = await _phase(backend, env, Phase.FAILED)
        assert obs.diagnosis.reason is FailureReason.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
        assert obs.reported == kept  # type: ignore[attr-defined]
        await backend.delete(env)


async def test_a_vm_whose_executor_was_killed_gives_the_steps_gitea_accepted_from_its_console(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """Issue 18 item 7: an executor killed after Gitea accepted step 1 ends its VM, and execd
    with it; the entrypoint printed the state file on the console, which the backend reads
    (once) for the failed job, so the reaper finalizes with step 1 succeeded."""
    kept = TaskState(7, steps=[StepState(0, Result.SUCCESS, log_index=0, log_length=2), StepState(1, started_at=T0)])
    source = tmp_path / "kept.pb"
    source.write_bytes(kept.encode())
    body = f"""
        cp {source} "$DYNRUNNER_STATE_FILE"
        kill -9 $$
    """
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, body)}) as osb,
        vm_backend(osb, tmp_path) as backend,
    ):
        env = await backend.create(vm_assignment())
        await _start(backend, env)
        obs = await _phase(backend, env, Phase.FAILED)
        assert obs.diagnosis.reason is FailureReason.KILLED  # type: ignore[attr-defined]
        assert obs.reported == kept  # type: ignore[attr-defined]
        report = failure_report(obs, [])  # type: ignore[arg-type]
        assert "dynrunner-accepted-state" not in report, report
        assert (await backend.observe(env)).reported == kept
        assert backend.api.requests["console"] == 1
        await backend.delete(env)


async def test_a_create_answer_lost_after_the_sandbox_was_made_makes_no_second_one(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, RUN)}) as osb,
        vm_backend(osb, tmp_path) as backend,
    ):
        osb.fail_next_create(CreateFailure(status=504, after_create=True))
        a = vm_assignment()
        env = await backend.create(a)
        again = await backend.create(a)
        assert len(osb.listed()) == 1 and env.extra["sandbox"] == again.extra["sandbox"]
        assert [e.assignment_id for e in await backend.list_owned()] == [a.assignment_id]


async def test_a_refused_create_says_why(opensandbox: OpenSandboxDouble, tmp_path: Path) -> None:
    async with vm_backend(opensandbox, tmp_path, image="registry.test/unknown:1") as backend:
        with pytest.raises(Exception, match=r"could not make the VM|refused the VM") as refused:
            await backend.create(vm_assignment())
        assert "pull" in str(refused.value).lower() or "image" in str(refused.value).lower()
        assert opensandbox.listed() == []


async def test_concurrent_creates_keep_one_sandbox(opensandbox_factory: OpenSandboxFactory, tmp_path: Path) -> None:
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, RUN)}) as osb,
        vm_backend(osb, tmp_path) as one,
        vm_backend(osb, tmp_path) as other,
    ):
        a = vm_assignment()
        envs = await asyncio.gather(one.create(a), other.create(a), one.create(a))
        assert len({e.extra["sandbox"] for e in envs}) == 1
        assert len(osb.listed()) == 1
        followed = await asyncio.gather(_start(one, envs[0]), _start(other, envs[1]))
        assert all(events[-1].stage is StartStage.STARTED for events in followed)
        await _phase(one, envs[0], Phase.RUNNING)
        [box] = osb.listed()
        await _console(box, "executor: run")
        await asyncio.sleep(0.5)
        assert box.console.read_text().count("executor: run") == 1


async def test_a_pending_sandbox_is_waited_for_on_the_kubernetes_runtime(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    image = stand_in_image(tmp_path, RUN)
    async with (
        opensandbox_factory(images={VM_IMAGE: image}, runtime="kubernetes", boot_delay_s=0.5) as osb,
        vm_backend(osb, tmp_path) as backend,
    ):
        env = await backend.create(vm_assignment())
        [box] = osb.listed()
        assert box.metadata["dynrunner-stage"] == "staged"
        events = await _start(backend, env)
        assert events[-1].stage is StartStage.STARTED
        await _phase(backend, env, Phase.RUNNING)


async def test_a_sandbox_with_metadata_no_job_has_does_not_break_the_pools_listing(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that does not hold metadata to label rules (or anyone who can write it) may
    hand back `²` or a 400-digit number: that sandbox is skipped and said once, the others listed."""
    async with opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, RUN)}) as osb:
        kept, spoilt, overflowing = vm_assignment(), vm_assignment(), vm_assignment()
        async with vm_backend(osb, tmp_path) as earlier:
            envs = {a.assignment_id: await earlier.create(a) for a in (kept, spoilt, overflowing)}
        osb.sandbox(envs[spoilt.assignment_id].extra["sandbox"]).metadata["dynrunner-task-id"] = "²"
        osb.sandbox(envs[overflowing.assignment_id].extra["sandbox"]).metadata["dynrunner-deadline"] = "9" * 400
        async with vm_backend(osb, tmp_path) as backend:  # a controller (re)starting lists them all
            for _ in range(2):
                await backend.watcher.sync(lambda _aid: None)
            assert [env.assignment_id for env in await backend.list_owned()] == [kept.assignment_id]
        skipped = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
        assert len(skipped) == 2, skipped


async def test_s3_credentials_reach_the_executor_in_the_vm_and_only_it(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """As the `local` backend passes the controller's `AWS_*` to its executors: delivered as a
    file beside the assignment (never in the sandbox's env or metadata), exported by the
    entrypoint for the executor alone, and deleted."""
    body = """
        echo "s3=$AWS_ACCESS_KEY_ID ${AWS_SECRET_ACCESS_KEY:+with-secret}"
        ls /run/dynrunner/delivery
        sleep 600
    """
    credentials = {"AWS_ACCESS_KEY_ID": "AKIATEST", "AWS_SECRET_ACCESS_KEY": "s3-secret-key"}
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, body)}) as osb,
        vm_backend(osb, tmp_path, artifact_env=credentials) as backend,
    ):
        env = await backend.create(vm_assignment())
        [box] = osb.listed()
        assert "s3-secret-key" not in str(box.env) and "s3-secret-key" not in str(box.metadata)
        await _start(backend, env)
        await _console(box, "s3=AKIATEST with-secret")
        await _console(box, "assignment.pb")
        assert not (box.rootfs / "run/dynrunner/delivery/env").exists()


async def test_a_vm_that_did_not_start_puts_its_consoles_last_lines_in_the_job_log(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """Its entrypoint says why (here: no executor in the image); the reaper's report — what the
    job log shows — carries the console's last lines (from the server's diagnostics logs)."""
    image = vm_image(DYNRUNNER_EXECUTOR_COMMAND="/nonexistent/dynrunner-executor")
    async with opensandbox_factory(images={VM_IMAGE: image}) as osb, vm_backend(osb, tmp_path) as backend:
        env = await backend.create(vm_assignment())
        await _start(backend, env)
        obs = await _phase(backend, env, Phase.FAILED)
        assert obs.diagnosis.reason is FailureReason.START_FAILED  # type: ignore[attr-defined]
        report = failure_report(obs, [])  # type: ignore[arg-type]
        assert "/nonexistent/dynrunner-executor" in report and "not found" in report, report
        assert env.extra["sandbox"] not in report


async def test_a_create_that_listed_the_sandbox_before_another_started_it_leaves_no_second_delivery(
    opensandbox_factory: OpenSandboxFactory, tmp_path: Path
) -> None:
    """Another controller staged and started the job between this one's look (stage `created`)
    and its staging: this one's delivery wins the now free `delivery.partial`, sees the job
    started, and withdraws it — no second copy of the assignment (nor a token) stays behind,
    and the stage stays `delivered`."""
    async with (
        opensandbox_factory(images={VM_IMAGE: stand_in_image(tmp_path, RUN)}) as osb,
        vm_backend(osb, tmp_path) as first,
        vm_backend(osb, tmp_path) as late,
    ):
        a = vm_assignment()
        env = await first.create(a)
        await _start(first, env)
        [box] = osb.listed()
        box.metadata["dynrunner-stage"] = "created"  # what the late one's list said
        again = await late.create(a)
        box.metadata["dynrunner-stage"] = "delivered"
        assert again.extra["sandbox"] == box.id
        run = box.rootfs / "run/dynrunner"
        assert [p for p in run.rglob("*") if p.is_file() and "/delivery/" not in str(p)] == []
