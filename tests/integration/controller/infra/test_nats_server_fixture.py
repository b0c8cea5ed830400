"""The nats-server fixture keeps its ports while it is stopped, so `stop()` … `start()` and
`restart()` come back on the same address even on a busy machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fixtures.local_backend import NOBODY
from tests.fixtures.nats import NatsServer
from tests.fixtures.ports import lock_name, reserve_port
from tests.fixtures.privileges import is_root


def ephemeral_range() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_a_stopped_servers_ports_are_neither_handed_out_by_the_kernel_nor_taken_by_another_server(
    tmp_path: Path,
) -> None:
    server = NatsServer(tmp_path / "one")
    other = NatsServer(tmp_path / "two")
    try:
        server.start()
        ports = {server.port, server.monitor_port}
        # An outgoing connection gets its local port from the ephemeral range: never these.
        assert not ports & set(ephemeral_range())
        server.stop()
        other.start()
        assert not ports & {other.port, other.monitor_port}
        server.start()
        assert {server.port, server.monitor_port} == ports
    finally:
        server.close()
        other.close()


def test_a_reserved_port_is_refused_to_any_other_process_of_any_user_until_released() -> None:
    """The lock is the kernel's, not a file's: a normal user's run and a root run on one
    machine never pick the same port (as root, the other process runs as nobody too)."""
    port, lock = reserve_port()
    take = f"import socket; socket.socket(socket.AF_UNIX).bind({lock_name(port)!r})"
    users: list[list[str]] = [[]]
    if is_root():
        users.append(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"])

    def taken_by(prefix: list[str]) -> bool:
        return subprocess.run([*prefix, sys.executable, "-c", take], capture_output=True, check=False).returncode == 0

    try:
        assert not any(taken_by(prefix) for prefix in users)
    finally:
        lock.close()
    assert all(taken_by(prefix) for prefix in users)
