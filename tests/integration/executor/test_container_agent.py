"""The container agent (agent/main.go) and the executor's client, here without a container:
the same protocol a job container's steps go through (docs/containers.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynrunner.executor.containers.agent import AgentProcesses
from dynrunner.executor.steps.process import StopTimings
from tests.fixtures.agent import agent_binary

FAST = StopTimings(sigint_grace=0.5, sigterm_grace=0.5, drain_after_exit=1.0)


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[AgentProcesses]:
    socket = tmp_path / "agent.sock"
    proc = await asyncio.create_subprocess_exec(str(agent_binary()), str(socket))
    try:
        for _ in range(500):
            if socket.exists():
                break
            await asyncio.sleep(0.01)
        yield AgentProcesses(socket)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 5)


async def run(agent: AgentProcesses, argv: list[str], *, cwd: str = "/", stop: asyncio.Event | None = None, **env: str):
    lines: list[str] = []
    code, stopped = await agent.run(
        argv,
        env={"PATH": os.defpath, **env},
        cwd=cwd,
        on_lines=lines.extend,
        stop=stop or asyncio.Event(),
        timings=FAST,
        backpressure=None,
    )
    return code, stopped, lines


async def test_a_process_gets_exactly_its_argv_env_and_cwd_and_reports_its_output_and_exit_code(
    agent: AgentProcesses, tmp_path: Path
) -> None:
    script = 'echo "arg=$1 greeting=$GREETING cwd=$(pwd)"; echo to-stderr >&2; printf "no newline"; exit 3'
    code, stopped, lines = await run(agent, ["sh", "-c", script, "sh", "a b"], cwd=str(tmp_path), GREETING="hé")
    assert (code, stopped) == (3, False)
    assert lines == [f"arg=a b greeting=hé cwd={tmp_path}", "to-stderr", "no newline"]
    _, _, env_lines = await run(agent, ["sh", "-c", "env | sort"], ONLY="1")
    assert sorted(env_lines) == ["ONLY=1", f"PATH={os.defpath}", "PWD=/"]


async def test_a_program_that_is_not_there_cannot_start(agent: AgentProcesses) -> None:
    with pytest.raises(OSError, match="no-such-program: not found"):
        await run(agent, ["no-such-program"])


async def test_which_looks_programs_up_on_the_given_path(agent: AgentProcesses, tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    found = await agent.which(["tool", "sh", "missing", str(tool)], f"{tmp_path}:/usr/bin:/bin")
    assert found["tool"] == str(tool)
    assert found[str(tool)] == str(tool)
    assert found["sh"] in ("/usr/bin/sh", "/bin/sh")
    assert "missing" not in found


async def test_stop_signals_the_whole_process_group_first_with_sigint(agent: AgentProcesses, tmp_path: Path) -> None:
    marker = tmp_path / "interrupted"
    script = f"trap 'echo INT > {marker}; exit 130' INT; sleep 30 & wait"
    stop = asyncio.Event()
    task = asyncio.create_task(run(agent, ["sh", "-c", script], stop=stop))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    stop.set()
    code, stopped, _ = await task
    assert stopped and code == 130
    assert marker.read_text() == "INT\n"
    assert time.monotonic() - started < 2


async def test_a_process_that_ignores_sigint_and_sigterm_is_killed(agent: AgentProcesses) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(run(agent, ["sh", "-c", "trap '' INT TERM; while :; do sleep 0.1; done"], stop=stop))
    await asyncio.sleep(0.3)
    stop.set()
    code, stopped, _ = await task
    assert stopped and code == 128 + 9


async def test_a_background_process_holding_the_output_does_not_hold_the_step(agent: AgentProcesses) -> None:
    started = time.monotonic()
    code, _, lines = await run(agent, ["sh", "-c", "sleep 30 & echo main done"])
    assert code == 0 and lines == ["main done"]
    assert time.monotonic() - started < 4  # the step's drain (1 s here), then the exit


async def test_many_steps_at_once_each_get_their_own_result(agent: AgentProcesses) -> None:
    results = await asyncio.gather(*(run(agent, ["sh", "-c", f"echo {i}; exit {i}"]) for i in range(20)))
    assert [(code, lines) for code, _, lines in results] == [(i, [str(i)]) for i in range(20)]


async def test_large_output_arrives_whole(agent: AgentProcesses) -> None:
    code, _, lines = await run(agent, ["sh", "-c", "i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done"])
    assert code == 0
    assert lines == [f"line-{i}" for i in range(20000)]


async def test_the_agent_gone_fails_the_step_clearly(tmp_path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (tmp_path / "agent.sock").unlink()
    with pytest.raises(OSError, match="agent is not reachable"):
        await run(AgentProcesses(tmp_path / "agent.sock"), ["true"])


async def test_env_answers_the_agents_own_environment(tmp_path: Path) -> None:
    """In a Pod the agent is the job container's first process: its environment is the image's."""
    socket = tmp_path / "agent.sock"
    env = {"PATH": "/opt/image/bin:/usr/bin:/bin", "IMAGE_VAR": "from the image", "EQUALS": "a=b"}
    proc = await asyncio.create_subprocess_exec(str(agent_binary()), str(socket), env=env)
    try:
        agent = await started(AgentProcesses(socket))
        assert await agent.env() == env
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 5)


async def test_shutdown_kills_every_process_group_it_started_and_exits(tmp_path: Path) -> None:
    socket = tmp_path / "agent.sock"
    proc = await asyncio.create_subprocess_exec(str(agent_binary()), str(socket))
    try:
        agent = await started(AgentProcesses(socket))
        # a step that left a process behind (its group outlives it), and one still running
        _, _, lines = await run(agent, ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"])
        left = int(lines[0])
        running = asyncio.create_task(run(agent, ["sh", "-c", "echo started; exec sleep 300"]))
        await asyncio.sleep(0.3)
        assert await agent.shutdown() == 2
        assert await asyncio.wait_for(proc.wait(), 5) == 0
        assert not socket.exists()
        with pytest.raises(OSError, match="broke off"):
            await asyncio.wait_for(running, 5)
        for _ in range(100):  # the killed sleep was re-parented: its reaper may take a moment
            if not _alive(left):
                break
            await asyncio.sleep(0.05)
        assert not _alive(left)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def started(agent: AgentProcesses) -> AgentProcesses:
    for _ in range(500):
        if agent.socket.exists():
            return agent
        await asyncio.sleep(0.01)
    raise AssertionError(f"the agent did not listen at {agent.socket}")


def _alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
