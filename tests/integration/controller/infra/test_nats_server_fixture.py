"""The nats-server fixture keeps its ports while it is stopped, so `stop()` … `start()` and
`restart()` come back on the same address even on a busy machine."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.nats import NatsServer


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
