"""Running one step in a scope, GitHub's way, for the job's steps and a composite action's alike.

For each step, in GitHub's order: its `env:` (on top of the scope's env context), its `if:`,
then name, `with:`, working directory, shell and `timeout-minutes`; the handler runs while
`JobSignals.supervise` watches for Gitea's cancellation, the timeouts and the deadline.
Whatever ended it, the step's environment files are read; `GITHUB_ENV` and `GITHUB_PATH`
change the job for every later step at every level, `GITHUB_STATE` is kept for the
action's later stages. The result — outcome, `continue-on-error` conclusion, outputs,
state, and the post step an action left to run at the end of the job — goes back to the
caller, which records it where it belongs (`run_steps`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from dynrunner.executor.actions import Actions
from dynrunner.executor.actions.seam import Limits, Prepared
from dynrunner.executor.actions.stages import ActionStages, PostStep
from dynrunner.executor.commands import CommandProcessor
from dynrunner.executor.contexts import StepRecord, reads_true
from dynrunner.executor.masking import Masker
from dynrunner.executor.reporter import Reporter
from dynrunner.executor.runtime import ArtifactError, JobRuntime, StepFiles
from dynrunner.executor.runtime.ahead import StepFilesPool
from dynrunner.executor.scope import Evaluator, Scope
from dynrunner.executor.stepenv import StepEnvironment
from dynrunner.executor.steps import Handler, StepRun, form_of, handler_for
from dynrunner.executor.steps.base import ContainerImages, Stop, StopSignal
from dynrunner.executor.steps.files import read_step_files
from dynrunner.executor.steps.processes import LOCAL, Processes
from dynrunner.executor.supervise import JobSignals
from dynrunner.executor.workflow import Step
from dynrunner.proto.expressions import ExpressionError
from dynrunner.proto.gitea import Result


@dataclass(frozen=True, slots=True)
class StepResult:
    outcome: str
    conclusion: str
    outputs: dict[str, str] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    post: PostStep | None = None

    def record(self) -> StepRecord:
        return StepRecord(outcome=self.outcome, conclusion=self.conclusion, outputs=self.outputs)


SKIPPED = StepResult("skipped", "skipped")


def _has_entries(directory: Path) -> bool:
    """Whether the step left anything to upload (most steps leave nothing: skip the thread hop)."""
    try:
        with os.scandir(directory) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False


class StepEngine:
    def __init__(
        self,
        *,
        reporter: Reporter,
        masker: Masker,
        runtime: JobRuntime,
        environment: StepEnvironment,
        signals: JobSignals,
        step_debug: bool,
        actions: Actions | None = None,
        processes: Processes = LOCAL,
        images: ContainerImages | None = None,
    ) -> None:
        self.reporter = reporter
        self.processes = processes
        self.images = images
        self.masker = masker
        self.runtime = runtime
        self.environment = environment
        self.signals = signals
        self.step_debug = step_debug
        self.files: StepFilesPool = runtime.step_files_pool()
        self.actions = ActionStages(self, actions)

    def start(self) -> None:
        self.files.start()

    async def aclose(self) -> None:
        self.signals.close()
        await self.files.aclose()

    # -- sequences ------------------------------------------------------------------------------

    async def run_steps(self, steps: tuple[Step, ...], scope: Scope, *, caller: StopSignal | None = None) -> None:
        """Run `steps` in order in `scope`, recording each result there. The job's steps report
        their state to Gitea; a composite action's steps stop with the step that called it."""
        reporter = self.reporter
        for step in steps:
            if self.signals.halted() or (caller is not None and caller.reason is not None):
                return
            index = step.index
            started = (lambda i=index: reporter.step_started(i)) if scope.step_rows else None
            result = await self.run(step, scope, on_start=started, caller=caller)
            scope.record(step, result.record())
            if scope.step_rows:
                reporter.step_finished(index, Result.from_word(result.outcome))
            if result.post is not None:
                self.actions.posts.append(result.post)

    # -- one step -------------------------------------------------------------------------------

    def _github(self, step: Step, scope: Scope, files: StepFiles | None = None) -> dict[str, object]:
        github = dict(scope.github)
        github["action"] = step.action
        if files is not None:
            github["env"] = str(files.env)
            github["path"] = str(files.path)
        return github

    async def run(
        self,
        step: Step,
        scope: Scope,
        *,
        on_start: Callable[[], None] | None = None,
        caller: StopSignal | None = None,
    ) -> StepResult:
        """Run one step in `scope`; `on_start` is called once it is known to start."""
        ev = Evaluator(scope)
        keys = scope.keys
        row = scope.row_index(step)
        reporter_log = self.reporter.log

        def log(text: str) -> None:
            reporter_log(text, row)

        github = self._github(step, scope)
        env_context = scope.env_context()
        try:
            step_env = ev.strings(keys.env, step.env, env=env_context, github=github)
        except ExpressionError as err:
            return self._fail_before_start(f"The step's env could not be evaluated: {err}", on_start, log)
        if scope.env:
            step_env = {**scope.env, **step_env}
        env_context.update(step_env)
        try:
            runs = ev.condition(keys.if_, step.if_, env=env_context, github=github)
        except ExpressionError as err:
            return self._fail_before_start(f"The step's `if:` could not be evaluated: {err}", on_start, log)
        if not runs:
            return SKIPPED

        if on_start is not None:
            on_start()
        native = form_of(step) != "uses"
        files = await self.files.take() if native else None
        try:
            prepared = self._prepare(step, scope, ev, env_context, step_env, files, row, log)
        except ExpressionError as err:
            log(f"##[error]{err}")
            where = {"env": env_context, "github": self._github(step, scope, files)}
            return self._finish(step, "failure", {}, {}, ev, where, log)
        where = prepared.where
        try:
            minutes = ev.minutes(keys.timeout, step.timeout_minutes, **where)
        except ExpressionError as err:  # GitHub's runner reports it and runs the step without a timeout
            log("##[error]An error occurred when attempting to determine the step timeout.")
            log(f"##[error]{err}")
            minutes = None
        limits = Limits(minutes, self.signals.now() + minutes * 60 if minutes else None)

        def still_wanted() -> bool:
            """GitHub re-evaluates a running step's `if:` when the job is cancelled."""
            return prepared.holds(keys.if_, step.if_)

        if native:
            outcome, outputs, state = await self.execute(
                prepared, handler_for(step), files, limits=limits, still_wanted=still_wanted, caller=caller
            )
            return self._finish(step, outcome, outputs, state, ev, where, log)
        outcome, outputs, state, post = await self.actions.main(
            prepared, limits=limits, still_wanted=still_wanted, caller=caller
        )
        result = self._finish(step, outcome, outputs, state, ev, where, log)
        return replace(result, post=post) if post is not None else result

    def _prepare(
        self,
        step: Step,
        scope: Scope,
        ev: Evaluator,
        env_context: dict[str, str],
        step_env: dict[str, str],
        files: StepFiles | None,
        row: int | None,
        log: Callable[[str], None],
    ) -> Prepared:
        """Name (best effort), `with:`, working directory and shell; raises ExpressionError."""
        keys = scope.keys
        where: dict[str, object] = {"env": env_context, "github": self._github(step, scope, files)}
        try:
            name = ev.text(keys.name, step.name, **where) if step.name else step.display_name()
        except ExpressionError:
            name = step.display_name()  # the display name is best effort, as on GitHub
        with_ = ev.strings(keys.with_, step.with_, **where)
        workdir = self._working_directory(step, scope, ev, where)
        shell = self._shell(step, scope, ev, where)
        return Prepared(step, scope, ev, row, log, name, env_context, step_env, with_, workdir, shell, where)

    def prepare_for_setup(self, step: Step, scope: Scope) -> Prepared | None:
        """A job's step evaluated as the job starts, for its action's `pre` stage (None when
        it cannot be: the step reports why when it runs)."""
        ev = Evaluator(scope)
        env_context = scope.env_context()
        try:
            step_env = ev.strings(scope.keys.env, step.env, env=env_context, github=self._github(step, scope))
            env_context.update(step_env)
            return self._prepare(step, scope, ev, env_context, step_env, None, None, self.reporter.log)
        except ExpressionError:
            return None

    async def execute(
        self,
        p: Prepared,
        handler: Handler,
        files: StepFiles | None,
        *,
        limits: Limits,
        still_wanted: Callable[[], bool],
        caller: StopSignal | None,
        stage: str = "main",
        state: Mapping[str, str] | None = None,
    ) -> tuple[str, dict[str, str], dict[str, str]]:
        """Run `handler` for a prepared step (one stage of it) under supervision:
        (outcome, outputs, state). `files`: the stage's own, or None for a stage that starts
        no process (a composite action)."""
        step, log, row = p.step, p.log, p.row
        github = self._github(step, p.scope, files)
        where = {"env": p.env_context, "github": github}
        env = (
            self.environment.build(
                env_context=p.scope.job.env,
                step_env=p.step_env,
                action=step.action,
                action_vars=p.scope.action.variables(),
                files=files,
            )
            if files is not None
            else {}
        )
        processor = CommandProcessor(
            self.masker.add,
            debug=self.step_debug,
            allow_unsecure_commands=reads_true(env.get("ACTIONS_ALLOW_UNSECURE_COMMANDS")),
            allow_unsecure_stop_tokens=reads_true(env.get("ACTIONS_ALLOW_UNSECURE_STOPCOMMAND_TOKENS")),
        )
        reporter_log = self.reporter.log
        output = processor.writer(lambda text: reporter_log(text, row))
        stop = StopSignal()
        ev = p.ev
        run_key = p.scope.keys.run
        run = StepRun(
            step=step,
            name=p.name,
            env=env,
            env_context=p.env_context,
            step_env=p.step_env,
            with_=p.with_,
            working_directory=p.workdir,
            shell=p.shell,
            files=files,
            runtime=self.runtime,
            interpolate=lambda text: ev.text(run_key, text, **where),
            log=log,
            output=output,
            stop=stop,
            timings=self.signals.timings,
            backpressure=self.reporter.throttle,
            processes=self.processes,
            images=self.images,
            engine=self,
            scope=p.scope,
            stage=stage,
            state=state or {},
        )
        task = asyncio.create_task(handler(run), name=f"step-{step.action}")
        reason = await self.signals.supervise(
            task, stop, still_wanted=still_wanted, step_deadline=limits.deadline, caller=caller
        )
        ok = False
        if task.cancelled():  # it did not stop within the graces (see supervise)
            log("##[error]The step did not stop when asked and was cancelled.")
        else:
            try:
                ok = task.result()
            except Exception as err:  # a handler bug must not take the job down unreported
                log(f"##[error]The step failed unexpectedly: {type(err).__name__}: {err}")

        # A handler may say why it ended early (a composite action whose step was cancelled).
        outcome = self._outcome(ok, reason or stop.reason, limits.minutes, p.name, log)
        if files is None:
            return outcome, dict(run.outputs), {}
        found = await self._after(files, processor, outcome, log)
        if found is None:
            return ("failure" if outcome == "success" else outcome), {}, {}
        return outcome, {**run.outputs, **found[0]}, found[1]

    def _shell(self, step: Step, scope: Scope, ev: Evaluator, where: dict[str, object]) -> str | None:
        if step.shell:
            return ev.text(scope.keys.run, step.shell, **where)
        return scope.defaults.shell

    def _working_directory(self, step: Step, scope: Scope, ev: Evaluator, where: dict[str, object]) -> Path:
        raw = step.working_directory
        if raw is not None:
            raw = ev.text(scope.keys.working_directory, raw, **where)
        raw = raw if raw is not None else scope.defaults.working_directory
        workspace = self.runtime.workspace.path
        return workspace / raw if raw else workspace

    def _outcome(
        self, ok: bool, reason: Stop | None, minutes: float | None, name: str, log: Callable[[str], None]
    ) -> str:
        if reason is Stop.STEP_TIMEOUT:
            log(f"##[error]The action '{name}' has timed out after {minutes:g} minutes.")
        if reason is not None:
            return reason.outcome
        return "success" if ok else "failure"

    async def _after(
        self, files: StepFiles, processor: CommandProcessor, outcome: str, log: Callable[[str], None]
    ) -> tuple[dict[str, str], dict[str, str]] | None:
        """Apply the step's commands and files: (outputs, state), or None when they fail the step."""
        effects = processor.effects
        failed = bool(effects.errors)
        found = read_step_files(self.runtime, files, effects.outputs)
        if found.rows:
            log("\n".join(found.rows) + "\n")
        failed = failed or found.failed
        env = self.signals.contexts.env
        for key, value in {**effects.env, **found.env}.items():
            env[key] = value
        self.environment.add_path([*effects.path, *found.path])
        if outcome == "success" and not failed and _has_entries(files.artifacts_dir):
            try:
                await self.runtime.after_step_success(files, log)
            except (ArtifactError, OSError) as err:
                log(f"##[error]{err}")
                failed = True
        return None if failed else (found.outputs, {**effects.state, **found.state})

    def _finish(
        self,
        step: Step,
        outcome: str,
        outputs: dict[str, str],
        state: dict[str, str],
        ev: Evaluator,
        where: dict[str, object],
        log: Callable[[str], None],
    ) -> StepResult:
        """`continue-on-error` turns a failed outcome into a successful conclusion."""
        conclusion = outcome
        if outcome == "failure" and step.continue_on_error:
            try:
                if ev.flag(ev.scope.keys.continue_on_error, step.continue_on_error, **where):
                    conclusion = "success"
                    log("Failed but continue next step (continue-on-error)")
            except ExpressionError as err:
                log(f"##[error]{err}")
        return StepResult(outcome, conclusion, outputs, state)

    def _fail_before_start(
        self, message: str, on_start: Callable[[], None] | None, log: Callable[[str], None]
    ) -> StepResult:
        """GitHub's runner fails a step whose `env:` or `if:` cannot be evaluated without
        consulting `continue-on-error`: the step never started."""
        if on_start is not None:
            on_start()
        log(f"##[error]{message}")
        return StepResult("failure", "failure")
