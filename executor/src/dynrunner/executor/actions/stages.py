"""An action's stages — `pre`, `main`, `post` — run through the step engine.

- **Set up job**: every remote action of the job's steps is fetched before the first step
  runs (GitHub's "Prepare all required actions"; one that cannot be fetched fails the job
  there), and the `pre` stage of each Node action that has one runs then, if its `pre-if`
  (default `always()`) holds. Its rows are the job's own (Gitea's "Set up job"); its state
  goes to the action's `main` and `post`; a failed `pre` fails the job. A local action's
  `pre` is not run (GitHub's rule: the workspace is not checked out yet), with a warning; an
  action nested in a composite action runs its `pre` just before its `main`.
- **main**: the action is loaded (within the step's time limits, stopped like a step), its
  inputs bound (`inputs.resolve_inputs`), and the handler of its kind runs.
- **Complete job**: the `post` stages actions left, the latest first, after the job's steps
  whatever their result, each if its `post-if` (default `always()`) holds against the
  job's status; rows in a `Post <step name>` group of the job's own rows (Gitea shows them
  under "Complete job", as act_runner reports post stages); a failed post stage fails the
  job. Nothing runs once the job was aborted (shutdown, the deadline, the task gone).

Gitea's step list is the workflow's: `pre` and `post` stages have no step state of their own.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dynrunner.executor.actions import ActionCall, ActionError, Actions, LoadedAction
from dynrunner.executor.actions.composite import run_composite
from dynrunner.executor.actions.inputs import input_env, resolve_inputs
from dynrunner.executor.actions.node import run_node
from dynrunner.executor.actions.reference import LocalAction, RemoteAction
from dynrunner.executor.actions.seam import Engine, Limits, Prepared
from dynrunner.executor.scope import ACTION_INPUT_DEFAULT, ACTION_POST_IF, ACTION_PRE_IF, Scope
from dynrunner.executor.steps.base import Handler, StepRun, StopSignal
from dynrunner.executor.steps.native import with_block
from dynrunner.executor.workflow import Step
from dynrunner.proto.expressions import EvalEnv, ExpressionError, interpolate

CONTAINER_RUNTIME_MISSING = (
    "needs a container engine, and this environment has none: container actions run in local and VM pools "
    "with podman installed (docs/containers.md), not in Pods. Use a JavaScript or composite action, or run the "
    "tool in a `run:` step."
)
_PASSED = ("GITHUB_", "GITEA_", "RUNNER_", "ACTIONS_", "INPUT_", "STATE_")


def container_env(run: StepRun, call: ActionCall) -> dict[str, str]:
    """What a container action sees: the runner's and the step's variables, its inputs and
    `runs.env` — not the executor's own environment (its PATH and HOME belong to another system)."""
    env = {k: v for k, v in run.env.items() if k.startswith(_PASSED) or k == "CI"}
    env.update(run.env_context)
    env.update(run.step_env)
    env.update(input_env(call.inputs))
    if call.manifest is not None:
        env.update(call.manifest.env)
    env.update(call.action_vars())
    return env


async def run_container_action(run: StepRun, call: ActionCall) -> bool:
    with_block(run, f"Run {call.display}")
    if run.images is None:
        run.log(f"##[error]The action {call.display} is a Docker container action, which {CONTAINER_RUNTIME_MISSING}")
        return False
    manifest = call.manifest
    build_dir: Path | None = None
    dockerfile = ""
    if manifest is None:  # `uses: docker://image`: `with: args` / `entrypoint` as on GitHub
        image = str(call.action.reference).removeprefix("docker://")
        entrypoint = call.inputs.get("entrypoint", "")
        try:
            args = shlex.split(call.inputs.get("args", ""))
        except ValueError as err:
            run.log(f"##[error]`with: args` of {call.display} could not be split into words: {err}")
            return False
    else:
        image = manifest.image
        entrypoint = manifest.entrypoint
        contexts = {"inputs": call.inputs, "env": dict(run.env_context)}
        if run.scope is not None:
            contexts["github"] = run.scope.github
        try:
            args = [interpolate(arg, EvalEnv(contexts=contexts)) for arg in manifest.args]
        except ExpressionError as err:
            run.log(f"##[error]runs.args of {call.display}: {err}")
            return False
        if image.startswith("docker://"):
            image = image.removeprefix("docker://")
        else:
            assert call.directory is not None
            build_dir, dockerfile = call.directory, image
            if not (build_dir / dockerfile).is_file():
                run.log(
                    f"##[error]The action {call.display} names {dockerfile!r} in runs.image, which it does not have"
                )
                return False
    return await run.images.run_image(
        run,
        image=image,
        build_dir=build_dir,
        dockerfile=dockerfile,
        entrypoint=entrypoint,
        args=args,
        env=container_env(run, call),
    )


ActionHandler = Callable[[StepRun, ActionCall], Coroutine[Any, Any, bool]]
"""The handler of an action's kind: a step handler that also gets the action it runs."""

HANDLERS: dict[str, ActionHandler] = {"composite": run_composite, "node": run_node, "docker": run_container_action}


def bound(kind: str, p: Prepared) -> Handler:
    """The handler of an action's kind as a step handler, bound to the action `p` calls."""
    call = p.action
    assert call is not None
    handler = HANDLERS[kind]

    async def run(step: StepRun) -> bool:
        return await handler(step, call)

    return run


@dataclass(frozen=True, slots=True)
class PostStep:
    """An action's `post` stage, run after the job's steps (the latest registered first)."""

    prepared: Prepared
    condition: str
    """`post-if`; empty means `always()`."""
    state: dict[str, str] = field(default_factory=dict)


class ActionStages:
    def __init__(self, engine: Engine, actions: Actions | None) -> None:
        self.engine = engine
        self.actions = actions
        self.posts: list[PostStep] = []
        self._pre_state: dict[int, dict[str, str]] = {}
        self._pre_done: set[int] = set()

    # -- Set up job ---------------------------------------------------------------------------

    async def prepare(self, steps: tuple[Step, ...], scope: Scope) -> bool:
        """Fetch the job's remote actions and run their `pre` stages; False fails the job."""
        actions = self.actions
        if actions is None:
            return True
        engine = self.engine
        log = engine.reporter.log
        wanted: list[tuple[Step, RemoteAction]] = []
        for step in steps:
            if step.uses is None or step.run is not None or "${{" in step.uses or step.uses.startswith("dynrunner://"):
                continue
            try:
                reference = actions.parse(step.uses)
            except ActionError:
                continue  # the step itself reports it when it runs
            if isinstance(reference, RemoteAction):
                wanted.append((step, reference))
        if not wanted:
            return True
        log("Prepare all required actions")
        loaded: list[tuple[Step, LoadedAction]] = []
        for step, _ in wanted:
            if engine.signals.halted():
                return True
            try:
                action = await self._supervised(actions.load(str(step.uses), log))
            except ActionError as err:
                log(f"##[error]{err}")
                return False
            if action is None:
                return True
            loaded.append((step, action))
        for step, action in loaded:
            manifest = action.manifest
            if manifest is not None and manifest.kind == "node" and manifest.pre and not engine.signals.halted():
                await self._pre_at_setup(step, action, scope)
        return True

    async def _supervised(self, work: Coroutine[Any, Any, LoadedAction]) -> LoadedAction | None:
        """Loading at setup, stopped like a step by a cancel, the shutdown or the deadline."""
        task = asyncio.ensure_future(work)
        reason = await self.engine.signals.supervise(task, StopSignal(), still_wanted=lambda: False)
        if reason is not None or task.cancelled():
            return None
        return task.result()

    async def _pre_at_setup(self, step: Step, action: LoadedAction, scope: Scope) -> None:
        engine = self.engine
        self._pre_done.add(step.index)
        prepared = engine.prepare_for_setup(step, scope)
        if prepared is None:
            return
        call = self._bind(prepared, action)
        if call is None:
            return  # the step reports it when it runs
        state = await self._pre(replace(prepared, action=call, row=None, log=engine.reporter.log))
        if state is None:
            if scope.job.status == "success":
                scope.job.status = "failure"
            return
        self._pre_state[step.index] = state

    async def _pre(self, p: Prepared) -> dict[str, str] | None:
        """The `pre` stage if its `pre-if` holds: its state, or None when it failed."""
        assert p.action is not None and p.action.manifest is not None
        condition = p.action.manifest.pre_if or "always()"
        if not p.holds(ACTION_PRE_IF, condition):
            return {}
        outcome, _, state = await self.engine.execute(
            p,
            bound("node", p),
            await self.engine.files.take(),
            limits=Limits(),
            still_wanted=lambda: p.holds(ACTION_PRE_IF, condition),
            caller=None,
            stage="pre",
        )
        return state if outcome == "success" else None

    # -- main -----------------------------------------------------------------------------------

    def _bind(self, p: Prepared, action: LoadedAction) -> ActionCall | None:
        """The action with the step's inputs; None (after logging why) when they are wrong."""
        actions = self.actions
        assert actions is not None
        manifest = action.manifest
        if manifest is None:
            return ActionCall(action, dict(p.with_), actions.node)

        def default(value: object) -> str:
            return p.ev.text(ACTION_INPUT_DEFAULT, value, **p.where)

        try:
            inputs = resolve_inputs(manifest, p.with_, default, action=action.display)
        except ExpressionError as err:
            p.log(f"##[error]{err}")
            return None
        for warning in inputs.warnings:
            p.log(f"##[warning]{warning}")
        return ActionCall(action, inputs.values, actions.node)

    async def main(
        self, p: Prepared, *, limits: Limits, still_wanted: Callable[[], bool], caller: StopSignal | None
    ) -> tuple[str, dict[str, str], dict[str, str], PostStep | None]:
        """The `main` stage of a `uses:` step: (outcome, outputs, state, its post stage)."""
        engine, actions, step = self.engine, self.actions, p.step
        if actions is None:
            p.log(f"##[error]This runner cannot run the action `{step.uses}` here: actions are not configured.")
            return "failure", {}, {}, None
        try:
            uses = p.ev.text(p.scope.keys.with_, step.uses, **p.where)
        except ExpressionError as err:
            p.log(f"##[error]{err}")
            return "failure", {}, {}, None
        stop = StopSignal()
        loading = asyncio.ensure_future(actions.load(uses, p.log))
        reason = await engine.signals.supervise(
            loading, stop, still_wanted=still_wanted, step_deadline=limits.deadline, caller=caller
        )
        if reason is not None or loading.cancelled():
            return (reason.outcome if reason is not None else "cancelled"), {}, {}, None
        try:
            action = loading.result()
        except ActionError as err:
            p.log(f"##[error]{err}")
            return "failure", {}, {}, None
        call = self._bind(p, action)
        if call is None:
            return "failure", {}, {}, None
        p = replace(p, action=call)
        manifest = action.manifest
        state: dict[str, str] = {}
        if manifest is not None and manifest.kind == "node" and manifest.pre:
            if p.scope.top and step.index in self._pre_done:
                state = self._pre_state.pop(step.index, {})
            elif isinstance(action.reference, LocalAction):
                p.log(f"##[warning]`pre` execution is not supported for local action from '{action.display}'")
            else:
                pre_state = await self._pre(p)
                if pre_state is None:
                    return "failure", {}, {}, None
                state = pre_state
        kind = action.kind
        files = await engine.files.take() if kind != "composite" else None
        outcome, outputs, main_state = await engine.execute(
            p, bound(kind, p), files, limits=limits, still_wanted=still_wanted, caller=caller, state=state
        )
        state = {**state, **main_state}
        post = PostStep(p, manifest.post_if, state) if manifest is not None and manifest.post else None
        return outcome, outputs, state, post

    # -- Complete job -------------------------------------------------------------------------

    async def run_posts(self) -> None:
        while self.posts:
            post = self.posts.pop()
            if self.engine.signals.halted():
                return
            await self.run_post(post)

    async def run_post(self, post: PostStep) -> str:
        """One post stage; returns its outcome (`skipped` when its condition is false)."""
        engine = self.engine
        p = replace(post.prepared, row=None, log=engine.reporter.log)
        job = p.scope.job
        condition = post.condition or "always()"
        if not p.holds(ACTION_POST_IF, condition, status=job.status):
            return "skipped"
        outcome, _, _ = await engine.execute(
            p,
            bound("node", p),
            await engine.files.take(),
            limits=Limits(),
            still_wanted=lambda: p.holds(ACTION_POST_IF, condition, status=job.status),
            caller=None,
            stage="post",
            state=post.state,
        )
        if outcome != "success" and job.status == "success":
            job.status = "failure"
        return outcome
