"""Step files created ahead of their steps, in a worker thread.

Creating a step's inodes (a directory with its scripts and artifacts directories, five
environment files and its script) is a large part of a short step's cost on some file
systems (0.2–3 ms on the development VM's ext4, nearly all of it kernel time). The job's
steps are known at its start, so a worker creates their files in order while earlier steps
run, with an empty file for each script a step will write when its name is known ahead, and
a step takes its set when it starts. A set is handed out only if it is still untouched
(empty regular files, an empty artifacts directory, no symbolic links); otherwise, or when
the worker failed or has not got there, the step's files are created on the spot as
before, so every step still starts with fresh, empty files.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import stat
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from dynrunner.executor.runtime.workspace import StepFiles, Workspace

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class StepFilesAhead:
    """`scripts` maps the index of each step to prepare to the names of the scripts it will
    write into `StepFiles.script_dir` (empty files are made for them)."""

    def __init__(self, workspace: Workspace, scripts: Mapping[int, Sequence[str]]) -> None:
        self._workspace = workspace
        self._scripts = {index: tuple(names) for index, names in scripts.items()}
        self._order = [(index, concurrent.futures.Future[StepFiles]()) for index in self._scripts]
        self._sets = dict(self._order)  # the sets not taken yet; only the event loop's thread changes it
        self._stop = threading.Event()
        self._worker: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self._worker is None and self._sets:
            self._worker = asyncio.ensure_future(asyncio.to_thread(self._create_all))

    def _create_all(self) -> None:
        for index, future in self._order:
            if self._stop.is_set():
                future.cancel()
                continue
            if not future.set_running_or_notify_cancel():
                continue  # taken (or given up) before the worker got here
            try:
                files = self._workspace.step_files(index)
                for name in self._scripts[index]:
                    os.close(os.open(files.script_dir / name, _CREATE, 0o755))
                future.set_result(files)
            except Exception as err:  # the step creates its files again and meets the error itself
                future.set_exception(err)

    async def take(self, index: int) -> StepFiles:
        """Fresh files for step `index`: the set made ahead if it is untouched, else new ones."""
        future = self._sets.pop(index, None)
        if future is not None and not future.cancel():  # cancel() fails once the worker started it
            try:
                files = future.result() if future.done() else await asyncio.wrap_future(future)
            except Exception:  # made again below, where an error belongs to the step
                files = None
            if files is not None and untouched(files, self._scripts[index]):
                return files
        return self._workspace.step_files(index)

    async def aclose(self) -> None:
        """Stop creating sets nobody will take and wait for the worker."""
        self._stop.set()
        for future in self._sets.values():
            future.cancel()
        if self._worker is not None:
            await asyncio.shield(self._worker)


def untouched(files: StepFiles, scripts: Sequence[str] = ()) -> bool:
    empty: list[Path] = [files.output, files.env, files.path, files.state, files.summary]
    try:
        for path in empty + [files.script_dir / name for name in scripts]:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size:
                return False
        if not stat.S_ISDIR(os.lstat(files.artifacts_dir).st_mode):
            return False
        with os.scandir(files.artifacts_dir) as entries:
            return next(entries, None) is None
    except OSError:
        return False
