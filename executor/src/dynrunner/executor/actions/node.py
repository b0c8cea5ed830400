"""JavaScript actions: `runs.using: node12 | node16 | node20 | node24`, one file per stage.

A stage runs `node <action dir>/<file>` in GITHUB_WORKSPACE with the step's environment,
the inputs as `INPUT_*`, the state its earlier stages saved as `STATE_*`, and
GITHUB_ACTION_PATH, _REPOSITORY and _REF naming the action. Node itself is found once per
job (`nodejs`).
"""

from __future__ import annotations

from collections.abc import Mapping

from dynrunner.executor.actions import ActionCall
from dynrunner.executor.actions.inputs import input_env
from dynrunner.executor.actions.nodejs import NodeError, version_warning
from dynrunner.executor.steps.base import StepRun

STAGE_TITLES = {"pre": "Pre ", "main": "", "post": "Post "}


def header(title: str, inputs: Mapping[str, str], run: StepRun) -> list[str]:
    """A stage's header: its title, the action's inputs and the step's env context, folded."""
    rows = [f"##[group]{title}"]
    if inputs:
        rows.append("with:")
        rows += [f"  {key}: {value}" for key, value in inputs.items()]
    if run.env_context:
        rows.append("env:")
        for key, value in run.env_context.items():
            first, *rest = value.splitlines() or [""]
            rows.append(f"  {key}: {first}")
            rows += [f"    {line}" for line in rest]
    rows.append("##[endgroup]")
    return rows


async def run_node(run: StepRun, call: ActionCall) -> bool:
    assert call.manifest is not None and call.node is not None
    manifest = call.manifest
    stage = run.stage
    script = {"pre": manifest.pre, "main": manifest.main, "post": manifest.post}[stage]
    title = f"Run {call.display}" if stage == "main" else f"{STAGE_TITLES[stage]}{run.name}"
    run.log("\n".join(header(title, call.inputs, run)) + "\n")
    try:
        node = await call.node.find()
    except NodeError as err:
        run.log(f"##[error]{err}")
        return False
    warning = version_warning(manifest.using, node)
    if warning and stage == "main":
        run.log(f"##[warning]{warning}")
    assert call.directory is not None
    path = call.directory / script
    if not path.is_file():
        run.log(f"##[error]File not found: '{path}' (`runs.{stage}` of the action {call.display})")
        return False
    env = dict(run.env)
    env.update(input_env(call.inputs))
    env.update({f"STATE_{key}": value for key, value in run.state.items()})
    env.update(call.action_vars())
    try:
        code, stopped = await run.processes.run(
            [node.executable, str(path)],
            env=env,
            cwd=str(run.runtime.workspace.path),
            on_lines=run.output,
            stop=run.stop.event,
            timings=run.timings,
            backpressure=run.backpressure,
        )
    except (OSError, ValueError) as err:
        run.log(f"##[error]An error occurred trying to start process '{node.executable}': {err}")
        return False
    if code != 0 and not stopped:
        run.log(f"##[error]Process completed with exit code {code}.")
    return code == 0 and not stopped
