"""A step's process: its own process group, output read in large chunks, stopped as a group.

Each step runs in a new session (so a new process group); stopping it signals the whole
group the way GitHub's runner stops a step: SIGINT, then SIGTERM after `sigint_grace`
(7.5 s), then SIGKILL after `sigterm_grace` (2.5 s). Output (stdout and stderr on one pipe,
so their order is kept) is read in chunks of up to 1 MiB and split into lines on `\\n`,
`\\r\\n` and `\\r`, as GitHub's runner splits them; invalid UTF-8 becomes U+FFFD. When the
step's main process exits while something it started in the background still holds the
output pipe, reading goes on for `drain_after_exit` (5 s, GitHub's figure) and then stops;
the background process is left running, as on GitHub.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

CHUNK = 1 << 20
MAX_LINE = 1 << 20


@dataclass(frozen=True, slots=True)
class StopTimings:
    sigint_grace: float = 7.5
    sigterm_grace: float = 2.5
    drain_after_exit: float = 5.0
    poll: float = 0.05


class LineSplitter:
    """Bytes in, complete lines out; keeps a partial last line for the next chunk."""

    __slots__ = ("_pending", "_skip_lf")

    def __init__(self) -> None:
        self._pending = b""
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[str]:
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        data = self._pending + chunk if self._pending else chunk
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut < 0:
            if len(data) >= MAX_LINE:
                self._pending = b""
                return [data.decode("utf-8", "replace")]
            self._pending = data
            return []
        self._pending = data[cut + 1 :]
        self._skip_lf = data[cut : cut + 1] == b"\r"
        text = data[:cut].decode("utf-8", "replace")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        return text.split("\n")

    def close(self) -> list[str]:
        rest, self._pending = self._pending, b""
        return [rest.decode("utf-8", "replace")] if rest else []


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to the group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _wait_group(proc: asyncio.subprocess.Process, pgid: int, within: float, poll: float) -> bool:
    """Wait until the main process has exited and the group is empty; True if it happened."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while loop.time() < end:
        if proc.returncode is not None and not _group_alive(pgid):
            return True
        await asyncio.sleep(poll)
    return proc.returncode is not None and not _group_alive(pgid)


async def _wait_exit(proc: asyncio.subprocess.Process) -> int:
    """The main process's exit code, as soon as it exits. (`Process.wait()` of Python 3.11 also
    waits until every holder of its output pipe has closed it, i.e. for background children.)"""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        exited: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(fd, ready)
        try:
            await exited
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    delay = 0.001
    while proc.returncode is None:  # the child watcher reaps it right after it exits
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return proc.returncode


async def stop_group(proc: asyncio.subprocess.Process, timings: StopTimings) -> None:
    """SIGINT, SIGTERM, then SIGKILL to the step's process group, each after its grace."""
    pgid = proc.pid
    for sig, grace in ((signal.SIGINT, timings.sigint_grace), (signal.SIGTERM, timings.sigterm_grace)):
        if not _signal_group(pgid, sig):
            return
        if await _wait_group(proc, pgid, grace, timings.poll):
            return
    _signal_group(pgid, signal.SIGKILL)


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    on_lines: Callable[[list[str]], None],
    stop: asyncio.Event,
    timings: StopTimings = StopTimings(),
) -> tuple[int, bool]:
    """Run `argv`; feed its output to `on_lines`. Returns (exit code, whether `stop` ended it).
    Raises OSError when the process cannot be started."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        limit=CHUNK,
    )
    assert proc.stdout is not None
    stream = proc.stdout
    splitter = LineSplitter()

    async def read() -> None:
        while chunk := await stream.read(CHUNK):
            lines = splitter.feed(chunk)
            if lines:
                on_lines(lines)
        tail = splitter.close()
        if tail:
            on_lines(tail)

    reader = asyncio.create_task(read(), name=f"step-output-{proc.pid}")
    exited = asyncio.create_task(_wait_exit(proc), name=f"step-wait-{proc.pid}")
    stopping = asyncio.create_task(stop.wait(), name=f"step-stop-{proc.pid}")
    stopped = False
    stopper: asyncio.Task[None] | None = None
    try:
        done, _ = await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stopping in done:
            stopped = True
            stopper = asyncio.create_task(stop_group(proc, timings), name=f"step-stop-group-{proc.pid}")
            await exited
            await stopper
        code = exited.result()
        try:
            await asyncio.wait_for(asyncio.shield(reader), timings.drain_after_exit)
        except TimeoutError:
            reader.cancel()
            tail = splitter.close()
            if tail:
                on_lines(tail)
        return code, stopped
    finally:
        for task in (stopping, exited, reader):
            task.cancel()
        if stopper is not None and not stopper.done():
            stopper.cancel()
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGKILL)
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()  # our end of the pipe, which a background process may still hold
        pending = [t for t in (stopping, exited, reader, stopper) if t is not None]
        await asyncio.gather(*pending, return_exceptions=True)
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_wait_exit(proc), 5)
