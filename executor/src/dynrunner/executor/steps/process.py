"""A step's process: its own process group, output read in large chunks, stopped as a group.

Each step runs in a new session (so a new process group); stopping it signals the whole
group the way GitHub's runner stops a step: SIGINT, then SIGTERM after `sigint_grace`
(7.5 s), then SIGKILL after `sigterm_grace` (2.5 s). Output (stdout and stderr on one pipe,
so their order is kept) is read in chunks of up to 256 KiB (the pipe is enlarged to
that, so a chatty step wakes the loop rarely) and split into lines on `\\n`,
`\\r\\n` and `\\r`, as GitHub's runner splits them; invalid UTF-8 becomes U+FFFD. When the
step's main process exits while something it started in the background still holds the
output pipe, reading goes on for `drain_after_exit` (5 s, GitHub's figure) and then stops;
the background process is left running, as on GitHub.

The process is started with `subprocess.Popen` and watched through a pidfd and a
non-blocking pipe on the event loop (asyncio's own subprocess support starts a watcher
thread per child and, on Python 3.11, waits for every holder of the pipe before it reports
the exit), which keeps the cost of a short step low.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

CHUNK = 1 << 18
MAX_LINE = 1 << 20
F_SETPIPE_SZ = 1031


@dataclass(frozen=True, slots=True)
class StopTimings:
    sigint_grace: float = 7.5
    sigterm_grace: float = 2.5
    drain_after_exit: float = 5.0
    poll: float = 0.05


class LineSplitter:
    """Bytes in, complete lines out; keeps a partial last line for the next chunk.

    A line longer than `MAX_LINE` is passed on as its first `MAX_LINE` bytes (far more than a
    log row shows) and the rest of it, up to its end, is dropped: a row of its own starting at
    an arbitrary byte could begin with the tail of a secret the cut split, which no mask matches.
    """

    __slots__ = ("_dropping", "_pending", "_skip_lf")

    def __init__(self) -> None:
        self._pending = b""
        self._skip_lf = False
        self._dropping = False

    def feed(self, chunk: bytes) -> list[str]:
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        if self._dropping:
            ends = [i for i in (chunk.find(b"\n"), chunk.find(b"\r")) if i >= 0]
            if not ends:
                return []
            first = min(ends)
            self._dropping = False
            if chunk[first : first + 2] == b"\r\n":
                first += 1
            elif first == len(chunk) - 1 and chunk[first:] == b"\r":
                self._skip_lf = True
            chunk = chunk[first + 1 :]
        data = self._pending + chunk if self._pending else chunk
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut < 0:
            if len(data) >= MAX_LINE:
                self._pending = b""
                self._dropping = True
                return [data[:MAX_LINE].decode("utf-8", "replace")]
            self._pending = data
            return []
        self._pending = data[cut + 1 :]
        self._skip_lf = data[cut : cut + 1] == b"\r"
        if data[cut - 1 : cut + 1] == b"\r\n":
            cut -= 1  # a CRLF ends the last line: its CR is not a line of its own
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


async def _fd_ready(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Until `fd` is readable (a pipe with data or EOF, a pidfd whose process exited)."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


class _Child:
    """The step's main process: exit seen through a pidfd, reaped here."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.returncode: int | None = None

    def _reap(self) -> bool:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: the status is lost
            self.returncode = self.proc.returncode if self.proc.returncode is not None else -1
            return True
        if pid == 0:
            return False
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode  # so Popen never warns that it is still running
        return True

    async def wait(self) -> int:
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            fd = -1
        try:
            if fd >= 0:
                while not self._reap():
                    await _fd_ready(loop, fd)
            else:
                delay = 0.001
                while not self._reap():
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.05)
        finally:
            if fd >= 0:
                os.close(fd)
        assert self.returncode is not None
        return self.returncode


async def _wait_group(child: _Child, within: float, poll: float) -> bool:
    """Wait until the main process has exited and the group is empty; True if it happened."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while loop.time() < end:
        if child.returncode is not None and not _group_alive(child.pid):
            return True
        await asyncio.sleep(poll)
    return child.returncode is not None and not _group_alive(child.pid)


async def stop_group(child: _Child, timings: StopTimings) -> None:
    """SIGINT, SIGTERM, then SIGKILL to the step's process group, each after its grace."""
    for sig, grace in ((signal.SIGINT, timings.sigint_grace), (signal.SIGTERM, timings.sigterm_grace)):
        if not _signal_group(child.pid, sig):
            return
        if await _wait_group(child, grace, timings.poll):
            return
    _signal_group(child.pid, signal.SIGKILL)


async def _read_pipe(
    fd: int,
    splitter: LineSplitter,
    on_lines: Callable[[list[str]], None],
    backpressure: Callable[[], Awaitable[None]] | None,
) -> None:
    """Read the pipe until EOF, in chunks, feeding complete lines to `on_lines`."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            await _fd_ready(loop, fd)
            continue
        if not chunk:
            break
        lines = splitter.feed(chunk)
        if lines:
            on_lines(lines)
            if backpressure is not None:
                await backpressure()
    tail = splitter.close()
    if tail:
        on_lines(tail)


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    on_lines: Callable[[list[str]], None],
    stop: asyncio.Event,
    timings: StopTimings = StopTimings(),
    backpressure: Callable[[], Awaitable[None]] | None = None,
) -> tuple[int, bool]:
    """Run `argv`; feed its output to `on_lines`. Returns (exit code, whether `stop` ended it).
    `backpressure` is awaited after each chunk: while it waits the pipe is not read, so a
    step printing faster than its log can be sent is slowed down instead of filling memory.
    Raises OSError when the process cannot be started."""
    proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec takes about a millisecond; watched below
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        bufsize=0,
    )
    assert proc.stdout is not None
    pipe = proc.stdout
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, CHUNK)  # fewer wakeups for chatty steps
    child = _Child(proc)
    splitter = LineSplitter()
    reader = asyncio.create_task(_read_pipe(fd, splitter, on_lines, backpressure), name=f"step-output-{child.pid}")
    exited = asyncio.create_task(child.wait(), name=f"step-wait-{child.pid}")
    stopping = asyncio.create_task(stop.wait(), name=f"step-stop-{child.pid}")
    stopped = False
    stopper: asyncio.Task[None] | None = None
    try:
        done, _ = await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stopping in done:
            stopped = True
            stopper = asyncio.create_task(stop_group(child, timings), name=f"step-stop-group-{child.pid}")
            await exited
            await stopper
        code = exited.result()
        try:
            await asyncio.wait_for(asyncio.shield(reader), timings.drain_after_exit)
        except TimeoutError:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            tail = splitter.close()
            if tail:
                on_lines(tail)
        return code, stopped
    finally:
        for task in (stopping, exited, reader, stopper):
            if task is not None:
                task.cancel()
        if child.returncode is None:
            _signal_group(child.pid, signal.SIGKILL)
        pending = [t for t in (stopping, exited, reader, stopper) if t is not None]
        await asyncio.gather(*pending, return_exceptions=True)
        if child.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(child.wait(), 5)
        pipe.close()
