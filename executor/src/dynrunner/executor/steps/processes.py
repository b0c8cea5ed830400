"""Where a step's processes run: here (`LOCAL`), or in a job container through its agent.

`run:` steps and Node actions go through this seam, so a job with `container:` runs the same
handlers as any other job; only the place the process starts, and where `shell:` is looked
up, differ (docs/containers.md).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from dynrunner.executor.steps.process import StopTimings, run_process


class Processes(Protocol):
    where: str
    """How an error names the place ("this environment", "the job container")."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        on_lines: Callable[[list[str]], None],
        stop: asyncio.Event,
        timings: StopTimings,
        backpressure: Callable[[], Awaitable[None]] | None,
    ) -> tuple[int, bool]:
        """(exit code, whether `stop` ended it); OSError/ValueError when it cannot start."""
        ...

    async def which(self, names: Sequence[str], path: str) -> dict[str, str]:
        """The programs among `names` found on `path` (a name with a `/` is checked as is)."""
        ...


class LocalProcesses:
    where = "this environment"

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        on_lines: Callable[[list[str]], None],
        stop: asyncio.Event,
        timings: StopTimings,
        backpressure: Callable[[], Awaitable[None]] | None,
    ) -> tuple[int, bool]:
        return await run_process(
            argv, env=env, cwd=cwd, on_lines=on_lines, stop=stop, timings=timings, backpressure=backpressure
        )

    async def which(self, names: Sequence[str], path: str) -> dict[str, str]:
        found = {name: shutil.which(name, path=path) for name in names}
        return {name: where for name, where in found.items() if where}


LOCAL = LocalProcesses()
