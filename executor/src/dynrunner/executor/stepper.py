"""Running the steps of a job: evaluate, start, supervise, stop, record.

For each step, in GitHub's order: the step's `env:` (on top of the job's env context), its
`if:`, then name, `with:`, working directory, shell and `timeout-minutes`; the handler runs
while the supervisor watches for Gitea's cancellation, the step and job timeouts and the
assignment deadline. Whatever ended it, the step's environment files are read; outputs,
`outcome` and `conclusion` (`continue-on-error`) go into the `steps` context.

On cancellation the job status becomes `cancelled` and the running step's `if:` is
evaluated again: when it no longer holds, the step is stopped (its process group gets
SIGINT, then SIGTERM, then SIGKILL). Later steps run only when their `if:` holds under the
new status (`always()`, `cancelled()`). When Gitea has ended the task otherwise (e.g. the
zombie reaper) or reporting has failed for good, the job is aborted: nothing more runs.
"""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dynrunner.executor import scopes
from dynrunner.executor.commands import CommandProcessor
from dynrunner.executor.contexts import JobContexts, StepRecord, reads_true
from dynrunner.executor.masking import Masker
from dynrunner.executor.reporter import Reporter
from dynrunner.executor.runtime import ArtifactError, JobRuntime, StepFiles
from dynrunner.executor.scopes import Evaluator, ExpressionError
from dynrunner.executor.steps import StepRun, handler_for
from dynrunner.executor.steps.files import read_step_files
from dynrunner.executor.steps.process import StopTimings
from dynrunner.executor.steps.shell import script_extension
from dynrunner.executor.workflow import Job, RunDefaults, Step, Workflow
from dynrunner.proto.gitea import Result

_FIXED = ("GITHUB_", "RUNNER_")  # the runner's variables a workflow cannot overwrite (GitHub's docs)


class Stop(enum.Enum):
    CANCELLED = "cancelled"
    STEP_TIMEOUT = "step timeout"
    JOB_TIMEOUT = "job timeout"
    DEADLINE = "deadline"
    ABORTED = "aborted"


@dataclass(slots=True)
class Deadlines:
    """Loop-clock instants. `job` moves to the cleanup budget once the job timed out."""

    job: float
    job_minutes: float
    hard: float | None = None
    job_timed_out: bool = False


def _has_entries(directory: Path) -> bool:
    """Whether the step left anything to upload (most steps leave nothing: skip the thread hop)."""
    try:
        with os.scandir(directory) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False


class StepExecutor:
    def __init__(
        self,
        *,
        job: Job,
        workflow: Workflow,
        contexts: JobContexts,
        evaluator: Evaluator,
        reporter: Reporter,
        masker: Masker,
        runtime: JobRuntime,
        base_env: Mapping[str, str],
        runner_env: Mapping[str, str],
        step_debug: bool,
        deadlines: Deadlines,
        settings_timings: StopTimings,
        cleanup_s: float,
        job_defaults: RunDefaults,
        shutdown: asyncio.Event,
    ) -> None:
        self.job = job
        self.workflow = workflow
        self.contexts = contexts
        self.evaluator = evaluator
        self.reporter = reporter
        self.masker = masker
        self.runtime = runtime
        # The layers of a step's environment (see _process_env): GitHub documents that the
        # GITHUB_* and RUNNER_* variables the runner sets cannot be overwritten, and that CI can.
        self.base_env = {**base_env, "CI": runner_env.get("CI", "true")}
        self.runner_env = {k: v for k, v in runner_env.items() if k != "CI" and not k.startswith(_FIXED)}
        self.fixed_env = {k: v for k, v in runner_env.items() if k.startswith(_FIXED)}
        self.step_debug = step_debug
        self.deadlines = deadlines
        self.timings = settings_timings
        self.cleanup_s = cleanup_s
        # The job's `defaults.run`, evaluated once when the job started, as GitHub's runner does.
        self.job_defaults = job_defaults
        self.prepend_path: list[str] = []
        self.aborted = False
        self._cancel_seen = False
        self.shutdown = shutdown
        self._cancel_wait = asyncio.create_task(reporter.cancelled.wait(), name="job-cancel-watch")
        self._shutdown_wait = asyncio.create_task(shutdown.wait(), name="job-shutdown-watch")
        self._files = runtime.step_files_ahead({step.index: self._scripts_of(step) for step in job.steps})

    def _scripts_of(self, step: Step) -> tuple[str, ...]:
        """The script a `run:` step will write, when its shell is known before the step runs."""
        shell = step.shell or self.job_defaults.shell or self.workflow.defaults.shell
        if step.run is None or (shell and "${{" in shell):
            return ()
        return (f"{step.id}{script_extension(shell)}",)

    async def aclose(self) -> None:
        self._cancel_wait.cancel()
        self._shutdown_wait.cancel()
        await self._files.aclose()

    # -- job-level signals ------------------------------------------------------------------

    def _note_cancel(self) -> None:
        """React once to the reporter's `cancelled`: a user cancel, or a task ended elsewhere."""
        if self._cancel_seen or not self.reporter.cancelled.is_set():
            return
        self._cancel_seen = True
        if self.reporter.server_result == Result.CANCELLED and self.reporter.error is None:
            self.contexts.status = "cancelled"
            self.reporter.log("##[error]The operation was canceled.")
        else:
            self.aborted = True

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _time_out_job(self) -> None:
        if not self.deadlines.job_timed_out:
            self.deadlines.job_timed_out = True
            self.deadlines.job = self._now() + self.cleanup_s
            if self.contexts.status != "cancelled":
                self.contexts.status = "failure"
            minutes = f"{self.deadlines.job_minutes:g}"
            self.reporter.log(
                f"##[error]The job running on runner {self.contexts.runner.get('name', '')} has exceeded the "
                f"maximum execution time of {minutes} minutes."
            )

    def _note_shutdown(self) -> bool:
        if self.shutdown.is_set() and not self.aborted:
            self.aborted = True
            self.contexts.status = "failure"
            self.reporter.log("##[error]The runner's environment is shutting down; the job was stopped.")
        return self.shutdown.is_set()

    def _past_hard_deadline(self) -> bool:
        hard = self.deadlines.hard
        if hard is not None and self._now() >= hard and not self.aborted:
            self.aborted = True
            self.contexts.status = "failure"
            self.reporter.log("##[error]The job reached the deadline set when it was claimed; it was stopped.")
        return self.aborted

    # -- the steps ------------------------------------------------------------------------------

    async def run_all(self) -> None:
        self._files.start()
        for step in self.job.steps:
            self._note_cancel()
            if self.aborted or self._note_shutdown() or self._past_hard_deadline():
                return
            if not self.deadlines.job_timed_out and self._now() >= self.deadlines.job:
                self._time_out_job()
            await self.run_step(step)

    def _github(self, step: Step, files: StepFiles | None = None) -> dict[str, object]:
        github = dict(self.contexts.github)
        github["action"] = step.action
        if files is not None:
            github["env"] = str(files.env)
            github["path"] = str(files.path)
        return github

    async def run_step(self, step: Step) -> None:
        i = step.index
        ev = self.evaluator
        github = self._github(step)
        try:
            step_env = ev.strings(scopes.STEP_ENV, step.env, env=self.contexts.env, github=github)
        except ExpressionError as err:
            self._fail_before_start(step, f"The step's env could not be evaluated: {err}")
            return
        env_context = {**self.contexts.env, **step_env}
        try:
            runs = ev.condition(scopes.STEP_IF, step.if_, env=env_context, github=github)
        except ExpressionError as err:
            self._fail_before_start(step, f"The step's `if:` could not be evaluated: {err}")
            return
        if not runs:
            self._record(step, "skipped", "skipped", {})
            self.reporter.step_finished(i, Result.SKIPPED)
            return

        self.reporter.step_started(i)
        files = await self._files.take(i)
        github = self._github(step, files)
        scope = {"env": env_context, "github": github}
        try:
            name = ev.text(scopes.STEP_NAME, step.name, **scope) if step.name else step.display_name()
        except ExpressionError:
            name = step.display_name()  # the display name is best effort, as on GitHub
        try:
            minutes = ev.minutes(scopes.STEP_TIMEOUT, step.timeout_minutes, **scope)
        except ExpressionError as err:  # GitHub's runner reports it and runs the step without a timeout
            self._log(i, "##[error]An error occurred when attempting to determine the step timeout.")
            self._log(i, f"##[error]{err}")
            minutes = None
        try:
            with_ = ev.strings(scopes.STEP_WITH, step.with_, **scope)
            workdir = self._working_directory(step, scope)
            shell = self._shell(step, scope)
        except ExpressionError as err:
            self._log(i, f"##[error]{err}")
            self._finish(step, "failure", {}, scope)
            return

        env = self._process_env(step, step_env, files)
        processor = CommandProcessor(
            self.masker.add,
            debug=self.step_debug,
            allow_unsecure_commands=reads_true(env.get("ACTIONS_ALLOW_UNSECURE_COMMANDS")),
            allow_unsecure_stop_tokens=reads_true(env.get("ACTIONS_ALLOW_UNSECURE_STOPCOMMAND_TOKENS")),
        )
        reporter_log = self.reporter.log
        feed = processor.feed

        def output(lines: list[str]) -> None:
            rows: list[str] = []
            append = rows.append
            for line in lines:
                if "::" in line or "##[" in line:
                    rows.extend(feed(line))
                else:
                    append(line)
            if rows:
                reporter_log("\n".join(rows) + "\n", i)

        stop = asyncio.Event()
        run = StepRun(
            step=step,
            name=name,
            env=env,
            env_context=env_context,
            with_=with_,
            working_directory=workdir,
            shell=shell,
            files=files,
            runtime=self.runtime,
            interpolate=lambda text: ev.text(scopes.STEP_RUN, text, **scope),
            log=lambda text: reporter_log(text, i),
            output=output,
            stop=stop,
            timings=self.timings,
            backpressure=self.reporter.throttle,
        )
        step_deadline = self._now() + minutes * 60 if minutes else None
        task = asyncio.create_task(handler_for(step)(run), name=f"step-{i}")
        reason = await self._supervise(task, stop, step, step_deadline, scope)
        ok = False
        if task.cancelled():  # it did not stop within the graces (see _supervise)
            self._log(i, "##[error]The step did not stop when asked and was cancelled.")
        else:
            try:
                ok = task.result()
            except Exception as err:  # a handler bug must not take the job down unreported
                self._log(i, f"##[error]The step failed unexpectedly: {type(err).__name__}: {err}")

        outcome = self._outcome(step, ok, reason, minutes, name)
        outputs = await self._after(step, files, processor, outcome)
        if outcome == "success" and outputs is None:
            outcome = "failure"
        self._finish(step, outcome, outputs or {}, scope)

    def _shell(self, step: Step, scope: dict[str, object]) -> str | None:
        if step.shell:
            return self.evaluator.text(scopes.STEP_RUN, step.shell, **scope)
        return self.job_defaults.shell or self.workflow.defaults.shell

    def _working_directory(self, step: Step, scope: dict[str, object]) -> Path:
        ev = self.evaluator
        raw = step.working_directory
        if raw is None:
            raw = self.job_defaults.working_directory or self.workflow.defaults.working_directory
        else:
            raw = ev.text(scopes.STEP_WORKING_DIRECTORY, raw, **scope)
        return self.runtime.workspace.path / raw if raw else self.runtime.workspace.path

    def _process_env(self, step: Step, step_env: Mapping[str, str], files: StepFiles) -> dict[str, str]:
        """From lowest to highest: the executor's environment and CI, the env context (workflow,
        job, GITHUB_ENV), the other variables a Gitea runner sets (GITEA_*, ACTIONS_*), the
        step's `env:`, the runner's GITHUB_* and RUNNER_* (not overwritable, as on GitHub, whose
        runner sets them from its contexts last), the step's file variables; then PATH."""
        env = dict(self.base_env)
        env.update(self.contexts.env)
        env.update(self.runner_env)
        env.update(step_env)
        env.update(self.fixed_env)
        env["GITHUB_ACTION"] = step.action
        step_files = files.env_vars()
        step_files.setdefault("GITEA_STATE", step_files["GITHUB_STATE"])
        step_files.setdefault("GITEA_STEP_SUMMARY", step_files["GITHUB_STEP_SUMMARY"])
        env.update(step_files)
        if self.prepend_path:
            front = os.pathsep.join(reversed(self.prepend_path))
            env["PATH"] = f"{front}{os.pathsep}{env['PATH']}" if env.get("PATH") else front
        # Last, so an installed dynrunner-executor (the image's) is found first.
        env["PATH"] = (
            f"{env['PATH']}{os.pathsep}{self.runtime.workspace.bin_dir}"
            if env.get("PATH")
            else str(self.runtime.workspace.bin_dir)
        )
        return env

    async def _supervise(
        self,
        task: asyncio.Task[bool],
        stop: asyncio.Event,
        step: Step,
        step_deadline: float | None,
        scope: dict[str, object],
    ) -> Stop | None:
        reason: Stop | None = None
        while not task.done() and reason is None:
            waiters: set[asyncio.Future[object]] = {task, self._shutdown_wait}  # type: ignore[arg-type]
            if not self._cancel_seen:
                waiters.add(self._cancel_wait)  # type: ignore[arg-type]
            limits = [t for t in (step_deadline, self.deadlines.job, self.deadlines.hard) if t is not None]
            timeout = max(0.0, min(limits) - self._now()) if limits else None
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                break
            now = self._now()
            if self._note_shutdown():
                reason = Stop.ABORTED
            elif self.reporter.cancelled.is_set() and not self._cancel_seen:
                self._note_cancel()
                if self.aborted:
                    reason = Stop.ABORTED
                elif not self._still_wanted(step, scope):
                    reason = Stop.CANCELLED
            elif self.deadlines.hard is not None and now >= self.deadlines.hard:
                self._past_hard_deadline()
                reason = Stop.DEADLINE
            elif step_deadline is not None and now >= step_deadline:
                reason = Stop.STEP_TIMEOUT
            elif now >= self.deadlines.job:
                if self.deadlines.job_timed_out:
                    reason = Stop.JOB_TIMEOUT
                else:
                    self._time_out_job()
                    reason = Stop.JOB_TIMEOUT
        if reason is not None:
            stop.set()
            t = self.timings
            await asyncio.wait({task}, timeout=t.sigint_grace + t.sigterm_grace + t.drain_after_exit + 2)
            if not task.done():
                task.cancel()
                await asyncio.wait({task})  # our own cancellation still propagates
        return reason

    def _still_wanted(self, step: Step, scope: dict[str, object]) -> bool:
        """GitHub re-evaluates a running step's `if:` when the job is cancelled."""
        try:
            return self.evaluator.condition(scopes.STEP_IF, step.if_, **scope)
        except ExpressionError as err:
            self._log(step.index, f"##[error]{err}")
            return False

    def _outcome(self, step: Step, ok: bool, reason: Stop | None, minutes: float | None, name: str) -> str:
        i = step.index
        if reason in (Stop.CANCELLED, Stop.ABORTED):
            return "cancelled"
        if reason is Stop.STEP_TIMEOUT:
            self._log(i, f"##[error]The action '{name}' has timed out after {minutes:g} minutes.")
            return "failure"
        if reason in (Stop.JOB_TIMEOUT, Stop.DEADLINE):
            return "failure"
        return "success" if ok else "failure"

    async def _after(
        self, step: Step, files: StepFiles, processor: CommandProcessor, outcome: str
    ) -> dict[str, str] | None:
        """Apply the step's commands and files; None when they fail the step."""
        i = step.index
        effects = processor.effects
        failed = bool(effects.errors)
        found = read_step_files(self.runtime, files, effects.outputs)
        if found.rows:
            self.reporter.log("\n".join(found.rows) + "\n", i)
        failed = failed or found.failed
        for key, value in {**effects.env, **found.env}.items():
            self.contexts.env[key] = value
        for entry in [*effects.path, *found.path]:
            if entry in self.prepend_path:
                self.prepend_path.remove(entry)
            self.prepend_path.append(entry)
        if outcome == "success" and not failed and _has_entries(files.artifacts_dir):
            try:
                await self.runtime.after_step_success(files, lambda text: self.reporter.log(text, i))
            except (ArtifactError, OSError) as err:
                self._log(i, f"##[error]{err}")
                failed = True
        return None if failed else found.outputs

    def _finish(
        self,
        step: Step,
        outcome: str,
        outputs: dict[str, str],
        scope: dict[str, object],
        *,
        may_continue: bool = True,
    ) -> None:
        """Record the step's end. `continue-on-error` turns a failed outcome into a successful
        conclusion only for a step that started (`may_continue`): GitHub's runner fails a step
        whose `env:` or `if:` cannot be evaluated without consulting it."""
        conclusion = outcome
        if outcome == "failure" and may_continue and step.continue_on_error:
            try:
                if self.evaluator.flag(scopes.STEP_CONTINUE, step.continue_on_error, **scope):
                    conclusion = "success"
                    self._log(step.index, "Failed but continue next step (continue-on-error)")
            except ExpressionError as err:
                self._log(step.index, f"##[error]{err}")
        self._record(step, outcome, conclusion, outputs)
        if conclusion == "failure" and self.contexts.status == "success":
            self.contexts.status = "failure"
        self.reporter.step_finished(step.index, Result.from_word(outcome))

    def _fail_before_start(self, step: Step, message: str) -> None:
        self.reporter.step_started(step.index)
        self._log(step.index, f"##[error]{message}")
        self._finish(step, "failure", {}, {"env": self.contexts.env, "github": self._github(step)}, may_continue=False)

    def _record(self, step: Step, outcome: str, conclusion: str, outputs: dict[str, str]) -> None:
        if step.user_id:
            self.contexts.steps[step.id] = StepRecord(outcome=outcome, conclusion=conclusion, outputs=outputs)

    def _log(self, index: int, text: str) -> None:
        self.reporter.log(text, index)
