"""Finding Node.js, which JavaScript actions run on (`node` runs their stages).

Node is found once per job: `DYNRUNNER_NODE` (a path, set in the executor image) if set,
else `node` on the executor's own PATH — not the job's, so a step that installs another
Node (`actions/setup-node`) does not change how actions run, as on GitHub, whose runner
brings its own. `node20` and `node24` actions run on it; one asking for a newer major than
it has, and every `node12`/`node16` action, runs with a warning. No Node at all fails the
step, saying what the executor image must carry.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass

NODE_ENV = "DYNRUNNER_NODE"


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
    def __init__(self, configured: str | None = None, path: str | None = None, *, mounted_at: str = "") -> None:
        self.configured = configured if configured is not None else os.environ.get(NODE_ENV, "")
        self.path = path if path is not None else os.environ.get("PATH", os.defpath)
        self.mounted_at = mounted_at
        """Where the job container sees this Node (docs/containers.md); '' outside one."""
        self._found: asyncio.Task[Node] | None = None

    def executable(self) -> str:
        """This Node's path here, or '' when there is none (to mount it in a job container)."""
        try:
            return os.path.realpath(_locate(self.configured, self.path))
        except NodeError:
            return ""

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
        return Node(self.mounted_at or executable, version)


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
