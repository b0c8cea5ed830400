"""Step files created ahead in a worker thread: a step still gets fresh, empty files of its own."""

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


async def until_created(rt: JobRuntime, index: int, last: str = "summary") -> None:
    """Until the worker has made `last` (a script comes after the environment files)."""
    async with asyncio.timeout(5):
        while not (rt.workspace.runtime_dir / "steps" / str(index) / last).exists():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def test_each_step_takes_its_own_fresh_set(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    ahead = rt.step_files_ahead({0: ["a.sh"], 1: [], 2: ["c.py"]})
    ahead.start()
    await until_created(rt, 2, "scripts/c.py")
    taken = [await ahead.take(i) for i in (0, 1, 2)]
    await ahead.aclose()
    assert [f.key for f in taken] == ["0", "1", "2"]
    assert all(fresh(f) for f in taken)
    assert [sorted(os.listdir(f.script_dir)) for f in taken] == [["a.sh"], [], ["c.py"]]
    assert (taken[0].script_dir / "a.sh").read_bytes() == b""


@pytest.mark.parametrize("touch", ["output", "env", "artifacts", "script"])
async def test_a_set_touched_before_its_step_starts_is_made_again(tmp_path: Path, touch: str) -> None:
    rt = runtime(tmp_path)
    ahead = rt.step_files_ahead({0: [], 1: ["run.sh"]})
    ahead.start()
    await ahead.take(0)
    await until_created(rt, 1, "scripts/run.sh")
    steps = rt.workspace.runtime_dir / "steps" / "1"
    elsewhere = tmp_path / "elsewhere"
    if touch == "output":
        (steps / "output").write_text("x=planted\n")  # an earlier step wrote where step 1's files are
    elif touch == "artifacts":
        (steps / "artifacts" / "leftover").write_text("old")
    else:
        link = steps / "env" if touch == "env" else steps / "scripts" / "run.sh"
        link.unlink()
        link.symlink_to(elsewhere)
    files = await ahead.take(1)
    await ahead.aclose()
    assert fresh(files) and not elsewhere.exists()
    assert os.listdir(files.script_dir) == []  # made on the spot: the step writes its script itself


async def test_steps_not_prepared_or_taken_twice_are_created_on_the_spot(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    ahead = rt.step_files_ahead({0: []})
    ahead.start()
    first = await ahead.take(0)
    first.output.write_text("x=1\n")
    again = await ahead.take(0)
    other = await ahead.take(5)
    await ahead.aclose()
    assert fresh(again) and fresh(other) and other.key == "5"


async def test_closing_stops_the_worker_and_leaves_no_task(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    ahead = rt.step_files_ahead({i: [] for i in range(200)})
    ahead.start()
    await ahead.aclose()
    created = os.listdir(rt.workspace.runtime_dir / "steps")
    assert len(created) < 200  # the rest was given up
    assert {t for t in asyncio.all_tasks() if t is not asyncio.current_task()} == set()


async def test_an_error_surfaces_when_the_step_takes_its_files(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    steps = rt.workspace.runtime_dir / "steps"
    shutil.rmtree(steps)
    steps.write_text("not a directory")
    ahead = rt.step_files_ahead({0: []})
    ahead.start()
    with pytest.raises(NotADirectoryError):
        await ahead.take(0)
    await ahead.aclose()
