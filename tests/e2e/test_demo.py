"""`dynrunner-controller demo` (what `make demo` runs) as a test: it must exit 0 on this machine."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

DEMO = [str(Path(sys.executable).parent / "dynrunner-controller"), "demo"]
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def leftovers(directory: Path) -> list[Path]:
    return list(directory.glob("dynrunner-demo-*"))


@pytest.mark.parametrize("gitea", ["1.26", "main"])
async def test_the_demo_runs_every_example_as_expected(tmp_path: Path, gitea: str) -> None:
    """As `make demo` runs it (Gitea 1.26), and against Gitea's main branch."""
    proc = await asyncio.create_subprocess_exec(
        *DEMO,
        "--gitea",
        gitea,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 110)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-5000:]
    assert "every result is the expected one" in text
    examples = sorted(p.name.removesuffix(".expected.yaml") for p in EXAMPLES.glob("*.expected.yaml"))
    assert len(examples) >= 4
    for name in examples:
        assert f"=== {name}.yml: run " in text and "MISMATCH" not in text
    # Each job's log is printed, with the controller's stage lines ahead of the executor's rows.
    assert "[dynrunner] claimed by pool local as runner" in text
    assert "testing version 1.4.1" in text
    # Nothing is left behind in the state directory (removed unless --keep).
    assert not leftovers(tmp_path)


async def test_the_demo_fails_when_a_result_differs(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "one.yml").write_text(
        "on: push\njobs:\n  only:\n    runs-on: [self-hosted, local]\n    steps:\n      - run: 'true'\n"
    )
    (examples / "one.expected.yaml").write_text("result: failure\njobs:\n  only: {result: failure}\n")
    proc = await asyncio.create_subprocess_exec(
        *DEMO,
        "--examples",
        str(examples),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 110)
    text = out.decode(errors="replace")
    assert proc.returncode == 1, text[-3000:]
    assert "the run ended 'success', expected 'failure'" in text
    assert "some results differ from the expected ones" in text
