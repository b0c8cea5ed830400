"""JavaScript actions: `runs.using: node12 | node16 | node20 | node24`, one file per stage.

Node is found once per job: `DYNRUNNER_NODE` (a path, set in the executor image) if set,
else `node` on the executor's own PATH — not the job's, so a step that installs another
Node (`actions/setup-node`) does not change how actions run, as on GitHub, whose runner
brings its own. `node20` and `node24` actions run on it; one asking for a newer major than
it has, and every `node12`/`node16` action, runs with a warning. No Node at all fails the
step, saying what the executor image must carry.

A stage runs `node <action dir>/<file>` in GITHUB_WORKSPACE with the step's environment,
the inputs as `INPUT_*`, the state its earlier stages saved as `STATE_*`, and
GITHUB_ACTION_PATH, _REPOSITORY and _REF naming the action.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass

from dynrunner.executor.actions.inputs import input_env
from dynrunner.executor.steps.base import StepRun
from dynrunner.executor.steps.process import run_process

NODE_ENV = "DYNRUNNER_NODE"
STAGE_TITLES = {"pre": "Pre ", "main": "", "post": "Post "}


class NodeError(RuntimeError):
    """No usable Node; the message says what to install or set."""


@dataclass(frozen=True, slots=True)
class Node:
    executable: str
    version: str
    """`v20.11.1` as `node --version` prints it."""

    @property
    def major(self) -> int:
        try:
            return int(self.version.lstrip("v").split(".", 1)[0])
        except ValueError:
            return 0


class NodeRuntime:
    def __init__(self, configured: str | None = None, path: str | None = None) -> None:
        self.configured = configured if configured is not None else os.environ.get(NODE_ENV, "")
        self.path = path if path is not None else os.environ.get("PATH", os.defpath)
        self._found: asyncio.Task[Node] | None = None

    async def find(self) -> Node:
        if self._found is None:
            self._found = asyncio.ensure_future(self._probe())
        return await asyncio.shield(self._found)

    async def _probe(self) -> Node:
        executable = _locate(self.configured, self.path)
        process = await asyncio.create_subprocess_exec(
            executable, "--version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        out, _ = await process.communicate()
        version = out.decode(errors="replace").strip()
        if process.returncode != 0 or not version.startswith("v"):
            raise NodeError(f"{executable} --version did not answer like Node.js does ({version!r})")
        return Node(executable, version)


def _locate(configured: str, path: str) -> str:
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise NodeError(f"{NODE_ENV} is {configured!r}, which is not an executable file")
        return configured
    found = shutil.which("node", path=path)
    if found is None:
        raise NodeError(
            "this action needs Node.js, which the executor's environment does not have: install `node` "
            f"(20 or newer) in the executor image, or set {NODE_ENV} to its path"
        )
    return found


def version_warning(using: str, node: Node) -> str | None:
    wanted = int(using.removeprefix("node") or 0)
    if wanted < 20:
        return (
            f"This action runs on {using}, which is no longer supported; it runs on the available Node "
            f"{node.version} instead. Update the action to a node20 or node24 release."
        )
    if node.major < wanted:
        return f"This action asks for {using}; this runner has Node {node.version}, on which it runs instead."
    return None


def header(title: str, run: StepRun) -> list[str]:
    rows = [f"##[group]{title}"]
    inputs = run.action.inputs if run.action is not None else run.with_
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


async def run_node(run: StepRun) -> bool:
    call = run.action
    assert call is not None and call.manifest is not None and call.node is not None
    manifest = call.manifest
    stage = run.stage
    script = {"pre": manifest.pre, "main": manifest.main, "post": manifest.post}[stage]
    title = f"Run {call.display}" if stage == "main" else f"{STAGE_TITLES[stage]}{run.name}"
    run.log("\n".join(header(title, run)) + "\n")
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
        code, stopped = await run_process(
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
