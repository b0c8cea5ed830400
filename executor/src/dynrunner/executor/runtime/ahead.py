"""Step files made ahead in a worker thread and handed out as steps start.

Creating a step's inodes (a directory with its scripts and artifacts directories, five
environment files and its script) is a large part of a short step's cost on some file
systems (0.2–3 ms on the development VM's ext4, nearly all of it kernel time). So a worker
keeps a few fresh sets ready, numbered in the order they are made (`steps/<n>`), and a
step — of the job or of a composite action, whichever starts next — takes the next one
when it starts; the worker then makes another. Each set has an empty `scripts/run.sh`,
the script of a `run:` step with the default shell or `bash`/`sh`.

A set is handed out only if it is still untouched (empty regular files, an empty artifacts
directory, no symbolic links); otherwise, or when the worker failed or is behind, the step's
files are created on the spot, so every step starts with fresh, empty files of its own.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from dynrunner.executor.runtime.workspace import StepFiles, Workspace

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
SCRIPTS_AHEAD = ("run.sh",)
"""The script a set is made with: a `run:` step's script under the default shell, bash or sh."""
AHEAD = 2
"""Sets kept ready: a step takes one while the worker makes the next."""


class StepFilesPool:
    def __init__(self, workspace: Workspace, ahead: int = AHEAD) -> None:
        self._workspace = workspace
        self._ahead = ahead
        self._next = 0  # the number of the next set, made ahead or on the spot
        self._ready: collections.deque[tuple[int, concurrent.futures.Future[StepFiles]]] = collections.deque()
        self._work: collections.deque[tuple[int, concurrent.futures.Future[StepFiles]]] = collections.deque()
        self._wake = threading.Condition()
        self._stopped = False
        self._worker: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self._worker is None and self._ahead > 0:
            self._refill()
            self._worker = asyncio.ensure_future(asyncio.to_thread(self._create_loop))

    def _refill(self) -> None:
        with self._wake:
            while len(self._ready) < self._ahead:
                entry = (self._next, concurrent.futures.Future[StepFiles]())
                self._next += 1
                self._ready.append(entry)
                self._work.append(entry)
            self._wake.notify()

    def _create_loop(self) -> None:
        while True:
            with self._wake:
                while not self._work and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    for _, future in self._work:
                        future.cancel()
                    return
                number, future = self._work.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                files = self._workspace.step_files(number)
                for name in SCRIPTS_AHEAD:
                    os.close(os.open(files.script_dir / name, _CREATE, 0o755))
                future.set_result(files)
            except Exception as err:  # the step creates its files itself and meets the error there
                future.set_exception(err)

    async def take(self) -> StepFiles:
        """Fresh files for the step that starts now."""
        files: StepFiles | None = None
        if self._ready:
            with self._wake:
                number, future = self._ready.popleft()
            self._refill()
            if not future.cancel():  # the worker has started on it (or finished)
                try:
                    files = future.result() if future.done() else await asyncio.wrap_future(future)
                except Exception:  # made again below, where an error belongs to the step
                    files = None
                if files is not None and not untouched(files, SCRIPTS_AHEAD):
                    files = None
            if files is None:
                files = self._workspace.step_files(number)
            return files
        number, self._next = self._next, self._next + 1
        return self._workspace.step_files(number)

    async def aclose(self) -> None:
        """Stop making sets nobody will take and wait for the worker."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
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
