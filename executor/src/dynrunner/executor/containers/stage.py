"""`dynrunner-executor stage-agent DIR`: put the agent and the executor's Node where a Pod's job
container finds them.

The first init container of a Pod with a job container runs this from the executor image, with
the shared `emptyDir` as DIR (docs/containers.md, "Pods: job containers"): the agent becomes the
job container's command (`DIR/dynrunner-agent`) and Node actions run on `DIR/node/bin/node`.
The job image needs neither. Exit 2, with one line on stderr, when either is missing here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from dynrunner.executor.actions.nodejs import NODE_ENV
from dynrunner.executor.containers.podman import AGENT_ENV

EXIT_MISSING = 2


class StageError(RuntimeError):
    """What could not be staged; the message says why."""


def _program(env: Mapping[str, str], setting: str, name: str, what: str) -> Path:
    configured = env.get(setting, "")
    found = configured or shutil.which(name, path=env.get("PATH", os.defpath)) or ""
    if not found:
        raise StageError(f"{what} is not installed here: set {setting}, or put `{name}` on PATH")
    path = Path(found)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise StageError(f"{what} {found} (from {setting or 'PATH'}) is not an executable file")
    return path.resolve()  # a `node` on PATH is often a symlink: copy what it points at


def _copy(source: Path, target: Path) -> None:
    """Copy, executable, into place at once (a partial file is never seen under `target`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(source, partial)
    partial.chmod(0o755)
    partial.replace(target)


def stage(directory: Path, env: Mapping[str, str]) -> tuple[Path, Path]:
    """Copy the agent to `directory/dynrunner-agent` and Node to `directory/node/bin/node`."""
    agent = _program(env, AGENT_ENV, "dynrunner-agent", "the container agent (dynrunner-agent, `make agent`)")
    node = _program(env, NODE_ENV, "node", "Node.js (for Node actions in the job container)")
    staged = (directory / "dynrunner-agent", directory / "node" / "bin" / "node")
    _copy(agent, staged[0])
    _copy(node, staged[1])
    return staged


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="the directory shared with the job container (/__dynrunner)")


def main(args: argparse.Namespace) -> int:
    try:
        agent, node = stage(args.directory, os.environ)
    except StageError as err:
        print(f"dynrunner-executor stage-agent: {err}", file=sys.stderr)
        return EXIT_MISSING
    except OSError as err:
        print(f"dynrunner-executor stage-agent: cannot copy into {args.directory}: {err}", file=sys.stderr)
        return 1
    print(f"staged {agent} and {node}")
    return 0
