"""`dynrunner-executor stage-agent DIR`, the first init container of a Pod with a job container:
the console script with the real agent and this machine's Node (docs/containers.md)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.agent import agent_binary
from tests.fixtures.executor import EXECUTOR_BIN


def stage_agent(directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(directory.parent)}
    return subprocess.run(
        [str(EXECUTOR_BIN), "stage-agent", str(directory)],
        env={**base, **env},
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_agent_and_node_are_staged_executable_and_they_run(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH")
    shared = tmp_path / "__dynrunner"
    done = stage_agent(shared, DYNRUNNER_AGENT=str(agent_binary()))
    assert done.returncode == 0, done.stderr
    agent, staged_node = shared / "dynrunner-agent", shared / "node" / "bin" / "node"
    assert agent.read_bytes() == agent_binary().read_bytes()
    assert staged_node.read_bytes() == Path(node).resolve().read_bytes()
    for path in (agent, staged_node):
        assert stat.S_IMODE(path.stat().st_mode) == 0o755
    version = subprocess.run([str(staged_node), "--version"], check=False, capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith("v")
    assert sorted(p.name for p in shared.rglob("*")) == ["bin", "dynrunner-agent", "node", "node"]  # no partials


def test_an_agent_on_path_and_a_configured_node_are_found(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "dynrunner-agent").symlink_to(agent_binary())
    fake_node = tmp_path / "my-node"
    fake_node.write_text("#!/bin/sh\necho v0\n")
    fake_node.chmod(0o700)
    done = stage_agent(tmp_path / "shared", PATH=f"{tools}:/usr/bin:/bin", DYNRUNNER_NODE=str(fake_node))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "shared" / "node" / "bin" / "node").read_text() == fake_node.read_text()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"PATH": "/nonexistent"},
            "dynrunner-executor stage-agent: the container agent (dynrunner-agent, `make agent`) is not installed "
            "here: set DYNRUNNER_AGENT, or put `dynrunner-agent` on PATH",
        ),
        (
            {"PATH": "/nonexistent", "DYNRUNNER_AGENT": "AGENT"},
            "dynrunner-executor stage-agent: Node.js (for Node actions in the job container) is not installed here: "
            "set DYNRUNNER_NODE, or put `node` on PATH",
        ),
        (
            {"DYNRUNNER_AGENT": "/nonexistent/dynrunner-agent"},
            "dynrunner-executor stage-agent: the container agent (dynrunner-agent, `make agent`) "
            "/nonexistent/dynrunner-agent (from DYNRUNNER_AGENT) is not an executable file",
        ),
    ],
)
def test_a_missing_program_is_exit_2_with_one_clear_line(tmp_path: Path, env: dict[str, str], message: str) -> None:
    env = {k: str(agent_binary()) if v == "AGENT" else v for k, v in env.items()}
    done = stage_agent(tmp_path / "shared", **env)
    assert done.returncode == 2
    assert done.stderr.strip() == message
    assert not (tmp_path / "shared" / "dynrunner-agent").exists()
