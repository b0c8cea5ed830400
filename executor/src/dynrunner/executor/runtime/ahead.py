"""Step files created ahead of their steps, in a worker thread.

Creating a step's eight inodes (a directory with its scripts and artifacts directories and
five environment files) is a large part of a short step's cost on some file systems
(0.2–3 ms on the development VM's ext4, nearly all of it kernel time). The job's steps are known at
its start, so a worker creates their files in order while earlier steps run, and a step
takes its set when it starts. A set is handed out only if it is still untouched (five empty
regular files and an empty artifacts directory, none a symbolic link); otherwise, or when the worker
failed or has not got there, the step's files are created on the spot as before, so every
step still starts with fresh, empty files.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import stat
import threading
from collections.abc import Sequence

from dynrunner.executor.runtime.workspace import StepFiles, Workspace


class StepFilesAhead:
    def __init__(self, workspace: Workspace, step_indexes: Sequence[int]) -> None:
        self._workspace = workspace
        self._order = [(index, concurrent.futures.Future[StepFiles]()) for index in step_indexes]
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
                future.set_result(self._workspace.step_files(index))
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
            if files is not None and untouched(files):
                return files
        return self._workspace.step_files(index)

    async def aclose(self) -> None:
        """Stop creating sets nobody will take and wait for the worker."""
        self._stop.set()
        for future in self._sets.values():
            future.cancel()
        if self._worker is not None:
            await asyncio.shield(self._worker)


def untouched(files: StepFiles) -> bool:
    try:
        for path in (files.output, files.env, files.path, files.state, files.summary):
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size:
                return False
        if not stat.S_ISDIR(os.lstat(files.artifacts_dir).st_mode):
            return False
        with os.scandir(files.artifacts_dir) as entries:
            return next(entries, None) is None
    except OSError:
        return False
