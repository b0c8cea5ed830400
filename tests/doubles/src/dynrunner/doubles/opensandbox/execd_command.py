"""execd's `POST /command`: a shell command run inside the sandbox, its output streamed back
as server-sent events (OpenSandbox `components/execd`: `pkg/runtime/command.go`,
`command_common.go`, `web/controller/sse.go`, `web/model/codeinterpreting.go`).

The body is `{command, cwd?, background?, timeout? (ms), uid?, gid?, envs?}`; the command runs
as `sh -c <command>` with the sandbox's environment plus `envs`, in its own process group.
Events, each a bare JSON object followed by a blank line as execd writes them: `init` (text =
the execution id), `stdout`/`stderr` per line, then `execution_complete` (execution_time in
ms) on exit 0, or `error` with `ename` CommandExecError and `evalue` the exit code (the SDK
reads the exit code from it; -1 when a signal ended it, as Go reports). A timeout kills the
group. A background command gets `init` and `execution_complete` at once and keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from dynrunner.doubles.opensandbox import boot

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _event(kind: str, **fields: Any) -> bytes:
    return json.dumps({"type": kind, **fields, "timestamp": int(time.time() * 1000)}).encode() + b"\n\n"


def _bad(message: str) -> JSONResponse:
    return JSONResponse(status_code=400, content={"code": "INVALID_REQUEST_BODY", "message": message})


async def run(box: Any, body: bytes) -> Response:
    try:
        request = json.loads(body or b"{}")
    except ValueError as err:
        return _bad(f"error parsing request, MAYBE invalid body format. {err}")
    if not isinstance(request, dict) or not request.get("command"):
        return _bad(
            "Key: 'RunCommandRequest.Command' Error:Field validation for 'Command' failed on the 'required' tag"
        )
    if request.get("gid") is not None and request.get("uid") is None:
        return _bad("uid is required when gid is provided")
    env = {**box.vm_env, **{str(k): str(v) for k, v in (request.get("envs") or {}).items()}}
    script = str(request["command"])
    if request.get("cwd"):
        script = f"cd {shlex.quote(str(request['cwd']))} && {script}"
    argv = ["/bin/sh", "-c", script]
    if request.get("uid") is not None:
        ids = [f"--reuid={request['uid']}", f"--regid={request.get('gid', request['uid'])}", "--clear-groups"]
        argv = ["setpriv", *ids, "--", *argv]
    if box.process is not None:
        argv = boot.enter(box.process.pid, argv)
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    execution_id = str(uuid.uuid4())
    if request.get("background"):
        return StreamingResponse(
            _background(execution_id, process), media_type="text/event-stream", headers=_SSE_HEADERS
        )
    timeout_ms = int(request.get("timeout") or 0)
    return StreamingResponse(
        _foreground(execution_id, process, timeout_ms), media_type="text/event-stream", headers=_SSE_HEADERS
    )


async def _background(execution_id: str, process: asyncio.subprocess.Process) -> AsyncIterator[bytes]:
    yield _event("init", text=execution_id)
    yield _event("execution_complete", execution_time=0)
    asyncio.get_running_loop().create_task(process.wait())


async def _foreground(execution_id: str, process: asyncio.subprocess.Process, timeout_ms: int) -> AsyncIterator[bytes]:
    started = time.monotonic()
    yield _event("init", text=execution_id)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def pump(stream: asyncio.StreamReader | None, kind: str) -> None:
        assert stream is not None
        async for line in stream:
            await queue.put(_event(kind, text=line.decode(errors="replace").rstrip("\n")))
        await queue.put(None)

    pumps = [asyncio.create_task(pump(process.stdout, "stdout")), asyncio.create_task(pump(process.stderr, "stderr"))]
    deadline = started + timeout_ms / 1000 if timeout_ms else None
    open_streams = 2
    try:
        while open_streams:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = await asyncio.wait_for(queue.get(), wait)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                deadline = None
                continue
            if item is None:
                open_streams -= 1
            else:
                yield item
        code = await process.wait()
    finally:
        for task in pumps:
            task.cancel()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    if code == 0:
        yield _event("execution_complete", execution_time=int((time.monotonic() - started) * 1000))
    else:
        value = str(code if code > 0 else -1)  # Go's ExitCode() is -1 for a process killed by a signal
        yield _event(
            "error", error={"ename": "CommandExecError", "evalue": value, "traceback": [f"exit status {value}"]}
        )
