"""A step's process: output split into lines, its own process group, stopped as a group."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from dynrunner.executor.steps.process import LineSplitter, StopTimings, run_process

FAST = StopTimings(sigint_grace=0.5, sigterm_grace=0.5, drain_after_exit=0.5, poll=0.02)


def test_splitter_handles_every_line_ending_and_chunk_boundaries() -> None:
    s = LineSplitter()
    assert s.feed(b"a\nb\r\nc\rd") == ["a", "b", "c"]
    assert s.feed(b"e\r") == ["de"]
    assert s.feed(b"\nf\n") == ["f"]  # the \n after a chunk-final \r ends nothing new
    assert s.feed(b"\n\n") == ["", ""]
    assert s.feed(b"\xc3") == []  # half of "é" waits for the rest
    assert s.feed(b"\xa9\xff\n") == ["é\ufffd"]
    assert s.feed(b"tail") == []
    assert s.close() == ["tail"]
    assert s.close() == []


def test_a_crlf_at_the_end_of_a_chunk_ends_one_line() -> None:
    """A program printing `line\\r\\n` in one write hands over chunks ending in CRLF: one row each."""
    s = LineSplitter()
    assert s.feed(b"a\r\n") == ["a"]
    assert s.feed(b"b\r\n") == ["b"]
    assert s.feed(b"c\r\r\n") == ["c", ""]  # a lone CR, then an empty CRLF line
    assert s.close() == []


def test_splitter_bounds_a_line_without_newline() -> None:
    """The first MiB of an over-long line is passed on; the rest of that line is dropped (a row
    starting mid-line could show the tail of a secret the cut split)."""
    s = LineSplitter()
    assert s.feed(b"x" * (1 << 20) + b"zz") == ["x" * (1 << 20)]
    assert s.feed(b"y" * 1000) == []
    assert s.feed(b"y\nnext\n") == ["next"]
    assert s.feed(b"w" * (1 << 20)) == ["w" * (1 << 20)]
    assert s.feed(b"more\r") == []  # the over-long line ends at a lone CR, as any line
    assert s.feed(b"\nafter\r\n") == ["after"]  # ... and its LF is not an empty line
    assert s.feed(b"v" * (1 << 20) + b"\r\nlast") == ["v" * (1 << 20)]
    assert s.close() == ["last"]


async def _run(
    script: str, tmp_path: Path, stop: asyncio.Event | None = None, timings: StopTimings = FAST
) -> tuple[int, bool, list[str]]:
    lines: list[str] = []
    code, stopped = await run_process(
        ["bash", "-c", script],
        env={"PATH": os.environ["PATH"]},
        cwd=str(tmp_path),
        on_lines=lines.extend,
        stop=stop or asyncio.Event(),
        timings=timings,
    )
    return code, stopped, lines


async def test_output_order_exit_code_and_cwd(tmp_path: Path) -> None:
    code, stopped, lines = await _run("echo out; echo err >&2; pwd; printf 'no newline'; exit 7", tmp_path)
    assert (code, stopped) == (7, False)
    assert lines == ["out", "err", str(tmp_path), "no newline"]


async def test_many_lines_arrive_complete(tmp_path: Path) -> None:
    code, _, lines = await _run("seq 1 200000", tmp_path)
    assert code == 0
    assert len(lines) == 200000 and lines[0] == "1" and lines[-1] == "200000"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


async def test_stop_signals_the_whole_group(tmp_path: Path) -> None:
    stop = asyncio.Event()
    pidfile = tmp_path / "child.pid"
    # A background job of a non-interactive shell starts with SIGINT ignored, so the child
    # restores it, as a step's own programs do, and only then writes the pid file: a stop never
    # comes before it. The SIGINT grace is long, so that a loaded machine cannot turn the stop
    # into a SIGTERM before the shell ran (the test ends as soon as the group is gone).
    child_program = (
        "import os, signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
    )
    script = f'echo started; python3 -c "{child_program}" {pidfile} & wait'
    patient = StopTimings(sigint_grace=30.0, sigterm_grace=0.5, drain_after_exit=0.5, poll=0.02)
    task = asyncio.create_task(_run(script, tmp_path, stop, patient))
    for _ in range(3000):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        await asyncio.sleep(0.02)
    child = int(pidfile.read_text())
    stop.set()
    signalled = time.monotonic()
    code, stopped, lines = await task
    # SIGINT was enough: the group was gone before the SIGTERM grace began. Bash itself ends
    # either by the SIGINT or, when it sees its `wait` child die of it first, with `wait`'s 0.
    assert stopped and code in (0, -signal.SIGINT), code
    assert time.monotonic() - signalled < patient.sigint_grace
    assert "started" in lines
    assert not _alive(child)


async def test_stop_escalates_to_sigkill_when_signals_are_ignored(tmp_path: Path) -> None:
    stop = asyncio.Event()
    script = "trap '' INT TERM; echo ready; while true; do sleep 0.05; done"
    task = asyncio.create_task(_run(script, tmp_path, stop))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    stop.set()
    code, stopped, _ = await task
    elapsed = time.monotonic() - started
    assert stopped and code == -9
    assert elapsed >= FAST.sigint_grace + FAST.sigterm_grace - 0.1


async def test_background_process_holding_the_pipe_does_not_block_the_step(tmp_path: Path) -> None:
    """It is left running, as on GitHub; reading stops `drain_after_exit` after the step's exit."""
    started = time.monotonic()
    code, stopped, lines = await _run(f"echo $$ > {tmp_path}/pgid; (sleep 30; echo late) & echo done", tmp_path)
    try:
        assert (code, stopped) == (0, False)
        assert lines == ["done"]
        assert time.monotonic() - started < FAST.drain_after_exit + 2
    finally:
        os.killpg(int((tmp_path / "pgid").read_text()), signal.SIGKILL)  # the test's own leftover group


async def test_crlf_output_gives_one_row_per_line(tmp_path: Path) -> None:
    code, _, lines = await _run("printf 'a\\r\\n'; sleep 0.05; printf 'b\\r\\n'; sleep 0.05; printf 'c\\n'", tmp_path)
    assert code == 0
    assert lines == ["a", "b", "c"]
