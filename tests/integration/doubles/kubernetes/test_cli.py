"""`dynrunner-kube-double serve` as a process: its JSON line, a kubeconfig the official
client loads, and a clean exit on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from kubernetes import client, config


def test_serve_prints_where_it_is_and_stops_on_sigterm(tmp_path: Path):
    bin_dir = Path(sys.executable).parent
    proc = subprocess.Popen(
        [
            str(bin_dir / "dynrunner-kube-double"),
            "serve",
            "--state-dir",
            str(tmp_path),
            "--node",
            "n1",
            "--node",
            "n2",
            "--token",
            "t",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        api = config.new_client_from_config(info["kubeconfig"])
        nodes = {n.metadata.name: n.metadata.uid for n in client.CoreV1Api(api).list_node().items}
        assert nodes == {name: node["uid"] for name, node in info["nodes"].items()} and set(nodes) == {"n1", "n2"}
        assert Path(info["nodes"]["n1"]["workloadApiSocket"]).is_socket()
        api.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None
        proc.stdout.close()
    assert not Path(info["nodes"]["n1"]["workloadApiSocket"]).exists()
