"""hashFiles(): the runner's digest (SHA-256 of the per-file SHA-256 digests in glob order)."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import pytest

from dynrunner.executor.hashfiles import hash_files as hash_workspace
from dynrunner.proto.expressions import ALLOWED_CONTEXTS, EvalEnv, ExpressionError, evaluate, interpolate


def expected(*contents: bytes) -> str:
    total = hashlib.sha256()
    for content in contents:
        total.update(hashlib.sha256(content).digest())
    return total.hexdigest()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    files = {
        "package-lock.json": b"root lock\n",
        "app/package-lock.json": b"app lock\n",
        "app/src/main.py": b"print('hi')\n",
        "app/src/util.py": b"x = 1\n",
        "Gemfile.lock": b"gems\n",
        ".cache/hidden.txt": b"hidden\n",
        "node_modules/dep/package-lock.json": b"dep lock\n",
        "B.txt": b"upper\n",
        "a.txt": b"lower\n",
    }
    for name, content in files.items():
        path = tmp_path / "ws" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return tmp_path / "ws"


def hash_files(workspace: Path, *patterns: str) -> str:
    args = ", ".join("'" + p.replace("'", "''") + "'" for p in patterns)
    return evaluate(f"hashFiles({args})", EvalEnv(hash_files=functools.partial(hash_workspace, workspace)))


def test_documentation_patterns(workspace: Path) -> None:
    # Depth-first with entries in byte order: app/, node_modules/, then the root's package-lock.json.
    assert hash_files(workspace, "**/package-lock.json") == expected(b"app lock\n", b"dep lock\n", b"root lock\n")
    assert hash_files(workspace, "**/package-lock.json", "**/Gemfile.lock") == expected(
        b"gems\n", b"app lock\n", b"dep lock\n", b"root lock\n"
    )


def test_exclusions_apply_in_order(workspace: Path) -> None:
    assert hash_files(workspace, "**/package-lock.json", "!**/node_modules/**") == expected(
        b"app lock\n", b"root lock\n"
    )
    assert hash_files(workspace, "!**/node_modules/**", "**/package-lock.json") == expected(
        b"app lock\n", b"dep lock\n", b"root lock\n"
    )


def test_a_directory_pattern_takes_its_files(workspace: Path) -> None:
    assert hash_files(workspace, "app/src") == expected(b"print('hi')\n", b"x = 1\n")
    assert hash_files(workspace, "app/src/") == expected(b"print('hi')\n", b"x = 1\n")
    assert hash_files(workspace, "./app/src/*.py") == expected(b"print('hi')\n", b"x = 1\n")


def test_globs_match_dot_files_and_byte_order(workspace: Path) -> None:
    assert hash_files(workspace, "**/*.txt") == expected(b"hidden\n", b"upper\n", b"lower\n")
    assert hash_files(workspace, "[aB].txt") == expected(b"upper\n", b"lower\n")
    assert hash_files(workspace, "?.txt") == expected(b"upper\n", b"lower\n")


def test_no_match_is_empty_string(workspace: Path) -> None:
    assert hash_files(workspace, "**/*.nothing") == ""
    assert hash_files(workspace, "/etc/hostname") == ""  # outside the workspace is ignored


def test_multiline_argument_and_comments(workspace: Path) -> None:
    assert hash_files(workspace, "# comment\nGemfile.lock\n\n  a.txt  ") == expected(b"gems\n", b"lower\n")


def test_symbolic_links(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"outside\n")
    os.symlink(outside, workspace / "linked")
    assert hash_files(workspace, "linked/**") == ""
    assert hash_files(workspace, "--follow-symbolic-links", "linked/**") == expected(b"outside\n")
    os.symlink(workspace / "missing", workspace / "broken")
    with pytest.raises(ExpressionError, match=r"^hashFiles\('broken'\) failed\. Fail to hash files under directory"):
        hash_files(workspace, "broken")


def test_errors(workspace: Path) -> None:
    with pytest.raises(
        ExpressionError, match=r"^Invalid glob option --bogus, avaliable option: '--follow-symbolic-links'"
    ):
        hash_files(workspace, "--bogus", "x")
    with pytest.raises(ExpressionError, match=r"Relative pathing '\.' and '\.\.' is not allowed"):
        hash_files(workspace, "../x")
    with pytest.raises(ExpressionError, match="Too few parameters supplied: 'hashFiles'"):
        evaluate("hashFiles()", EvalEnv(hash_files=functools.partial(hash_workspace, workspace)))
    with pytest.raises(ExpressionError, match="the job workspace is not known"):
        evaluate("hashFiles('x')", EvalEnv())
    with pytest.raises(ExpressionError, match="does not exist"):
        evaluate("hashFiles('x')", EvalEnv(hash_files=functools.partial(hash_workspace, workspace / "missing")))


def test_in_a_step_value(workspace: Path) -> None:
    env = EvalEnv(
        contexts={"runner": {"os": "Linux"}},
        allowed=ALLOWED_CONTEXTS["jobs.<job_id>.steps.with"],
        hash_files=functools.partial(hash_workspace, workspace),
    )
    key = interpolate("${{ runner.os }}-deps-${{ hashFiles('Gemfile.lock') }}", env)
    assert key == "Linux-deps-" + expected(b"gems\n")
