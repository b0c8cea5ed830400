"""Step files made ahead in a worker thread: each step that starts, at any level, still gets
fresh, empty files of its own."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from dynrunner.executor.runtime import JobRuntime, StepFiles
from dynrunner.proto.assignment import ArtifactStoreOptions


def runtime(root: Path) -> JobRuntime:
    return JobRuntime.create(
        root, repository="acme/app", run_id="7", job_key="build", artifacts=ArtifactStoreOptions(), needs={}
    )


def fresh(files: StepFiles) -> bool:
    empty = all(p.read_bytes() == b"" and not p.is_symlink() for p in (files.output, files.env, files.path))
    return empty and os.listdir(files.artifacts_dir) == [] and files.script_dir.is_dir()


async def until_created(rt: JobRuntime, number: int, last: str = "scripts/run.sh") -> None:
    """Until the worker has made `last` of set `number` (the script comes last)."""
    async with asyncio.timeout(5):
        while not (rt.workspace.runtime_dir / "steps" / str(number) / last).exists():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def test_each_step_takes_the_next_fresh_set(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    pool = rt.step_files_pool()
    pool.start()
    await until_created(rt, 1)
    taken = [await pool.take() for _ in range(5)]
    await pool.aclose()
    assert [f.key for f in taken] == ["0", "1", "2", "3", "4"]
    assert all(fresh(f) for f in taken)
    assert (taken[0].script_dir / "run.sh").read_bytes() == b""


@pytest.mark.parametrize("touch", ["output", "env", "artifacts", "script"])
async def test_a_set_touched_before_its_step_starts_is_made_again(tmp_path: Path, touch: str) -> None:
    rt = runtime(tmp_path)
    pool = rt.step_files_pool()
    pool.start()
    await pool.take()
    await until_created(rt, 1)
    steps = rt.workspace.runtime_dir / "steps" / "1"
    elsewhere = tmp_path / "elsewhere"
    if touch == "output":
        (steps / "output").write_text("x=planted\n")  # an earlier step wrote where the next files are
    elif touch == "artifacts":
        (steps / "artifacts" / "leftover").write_text("old")
    else:
        link = steps / "env" if touch == "env" else steps / "scripts" / "run.sh"
        link.unlink()
        link.symlink_to(elsewhere)
    files = await pool.take()
    await pool.aclose()
    assert files.key == "1"
    assert fresh(files) and not elsewhere.exists()
    assert os.listdir(files.script_dir) == []  # made on the spot: the step writes its script itself


async def test_without_the_worker_files_are_created_on_the_spot(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    pool = rt.step_files_pool()  # never started
    first = await pool.take()
    second = await pool.take()
    await pool.aclose()
    assert [first.key, second.key] == ["0", "1"] and fresh(first) and fresh(second)


async def test_closing_stops_the_worker_and_leaves_no_task(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    pool = rt.step_files_pool()
    pool.start()
    for _ in range(20):
        await pool.take()
    await pool.aclose()
    created = os.listdir(rt.workspace.runtime_dir / "steps")
    assert 20 <= len(created) <= 22  # at most the sets kept ready are left untaken
    assert {t for t in asyncio.all_tasks() if t is not asyncio.current_task()} == set()


async def test_an_error_surfaces_when_the_step_takes_its_files(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    steps = rt.workspace.runtime_dir / "steps"
    shutil.rmtree(steps)
    steps.write_text("not a directory")
    pool = rt.step_files_pool()
    pool.start()
    with pytest.raises(NotADirectoryError):
        await pool.take()
    await pool.aclose()
