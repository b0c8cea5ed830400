"""The executor's side of `dynrunner-agent` (agent/main.go): step processes in a job container.

One unix connection per process: a `run` frame (argv, the whole environment, cwd), then the
agent's `out` frames until `exit` (or `error`: it could not start). Stopping sends the step's
process group SIGINT, SIGTERM after `sigint_grace`, SIGKILL after `sigterm_grace`, as a local
step is stopped. `which`, `env` and `shutdown` are one request and one answer each.
Frames: a type byte, a 4-byte big-endian length, the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from dynrunner.executor.steps.process import LineSplitter, StopTimings

RUN, SIGNAL, WHICH, ENV, SHUTDOWN = b"r", b"s", b"w", b"v", b"q"
OUT, EXIT, ERROR, PATH = b"o", b"x", b"e", b"p"
HEAD = struct.Struct(">cI")
MAX_FRAME = 1 << 24
SOCKET_NAME = "agent.sock"


class AgentError(OSError):
    """The agent could not be reached, or broke the protocol."""


def frame(kind: bytes, payload: bytes) -> bytes:
    return HEAD.pack(kind, len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    kind, size = HEAD.unpack(await reader.readexactly(HEAD.size))
    if size > MAX_FRAME:
        raise AgentError(f"the agent sent a frame of {size} bytes")
    return kind, await reader.readexactly(size)


class AgentProcesses:
    """`Processes` (steps/processes.py) for a job container whose agent listens on `socket`."""

    where = "the job container"

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_unix_connection(str(self.socket), limit=MAX_FRAME)
        except OSError as err:
            raise AgentError(f"the job container's agent is not reachable at {self.socket}: {err}") from err

    async def _ask(self, kind: bytes, payload: bytes) -> tuple[bytes, bytes]:
        """One request, one answer (`which`, `env`, `shutdown`)."""
        reader, writer = await self._connect()
        try:
            writer.write(frame(kind, payload))
            await writer.drain()
            return await read_frame(reader)
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            raise AgentError(f"the job container's agent broke off: {err}") from err
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def which(self, names: Sequence[str], path: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for name in names:
            kind, payload = await self._ask(WHICH, json.dumps({"name": name, "path": path}).encode())
            if kind == PATH and payload:
                found[name] = payload.decode()
        return found

    async def env(self) -> dict[str, str]:
        """The agent's own environment: in a Pod's job container, the image's ENV and
        `container.env` (the agent is the container's first process)."""
        kind, payload = await self._ask(ENV, b"")
        if kind != ENV:
            raise AgentError(f"the agent answered `env` with a frame {kind!r} (is it older than this executor?)")
        try:
            items = json.loads(payload)
        except ValueError as err:
            raise AgentError(f"the agent's environment is not a JSON list: {err}") from err
        if not isinstance(items, list):
            raise AgentError("the agent's environment is not a JSON list")
        return dict(str(item).partition("=")[::2] for item in items)

    async def shutdown(self) -> int:
        """Ask the agent to kill every process group it started and exit; how many it killed."""
        kind, payload = await self._ask(SHUTDOWN, b"")
        if kind != SHUTDOWN:
            raise AgentError(f"the agent answered `shutdown` with a frame {kind!r}")
        return int(payload or b"0")

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
        for key, value in env.items():
            if "\0" in key or "=" in key or "\0" in value:  # as subprocess refuses them locally
                raise ValueError(f"illegal environment variable name or value: {key!r}")
        request = {
            "argv": list(argv),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": cwd,
            "drain": timings.drain_after_exit,
        }
        reader, writer = await self._connect()
        splitter = LineSplitter()
        stopped = False

        async def send_signals() -> None:
            nonlocal stopped
            await stop.wait()
            stopped = True
            for sig, grace in ((signal.SIGINT, timings.sigint_grace), (signal.SIGTERM, timings.sigterm_grace)):
                writer.write(frame(SIGNAL, str(int(sig)).encode()))
                await writer.drain()
                await asyncio.sleep(grace)
            writer.write(frame(SIGNAL, str(int(signal.SIGKILL)).encode()))
            await writer.drain()

        stopper = asyncio.create_task(send_signals(), name=f"agent-stop-{os.getpid()}")
        try:
            writer.write(frame(RUN, json.dumps(request).encode()))
            await writer.drain()
            while True:
                kind, payload = await read_frame(reader)
                if kind == OUT:
                    lines = splitter.feed(payload)
                    if lines:
                        on_lines(lines)
                        if backpressure is not None:
                            await backpressure()
                elif kind == EXIT:
                    tail = splitter.close()
                    if tail:
                        on_lines(tail)
                    return int(payload), stopped
                elif kind == ERROR:
                    raise OSError(payload.decode(errors="replace"))
                else:
                    raise AgentError(f"the agent sent an unknown frame {kind!r}")
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            raise AgentError(f"the job container's agent broke off (did the container stop?): {err}") from err
        finally:
            stopper.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await stopper
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
