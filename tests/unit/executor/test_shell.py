"""GitHub's `shell:` rules for `run:` steps."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dynrunner.executor.steps.shell import ShellError, resolve_shell


def _bin(directory: Path, *names: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(directory)


def test_default_is_bash_with_e_and_sh_without_bash(tmp_path: Path) -> None:
    both = _bin(tmp_path / "both", "bash", "sh")
    shell = resolve_shell(None, both)
    assert shell.executable == f"{both}/bash" and shell.args == "-e {0}" and shell.extension == ".sh"
    assert shell.display == f"{both}/bash -e {{0}}"
    only_sh = _bin(tmp_path / "sh", "sh")
    assert resolve_shell("", only_sh).executable == f"{only_sh}/sh"
    with pytest.raises(ShellError, match="neither bash nor sh"):
        resolve_shell(None, str(tmp_path / "empty"))


def test_builtin_shells(tmp_path: Path) -> None:
    path = _bin(tmp_path, "bash", "sh", "python", "pwsh", "powershell")
    assert resolve_shell("bash", path).argv("/s.sh") == [
        f"{path}/bash",
        "--noprofile",
        "--norc",
        "-e",
        "-o",
        "pipefail",
        "/s.sh",
    ]
    assert resolve_shell("sh", path).argv("/s.sh") == [f"{path}/sh", "-e", "/s.sh"]
    python = resolve_shell("python", path)
    assert python.argv("/s.py") == [f"{path}/python", "/s.py"] and python.extension == ".py"
    pwsh = resolve_shell("pwsh", path)
    assert pwsh.argv("/s.ps1") == [f"{path}/pwsh", "-command", ". '/s.ps1'"] and pwsh.extension == ".ps1"
    assert pwsh.script("Write-Host hi").startswith("$ErrorActionPreference = 'stop'\nWrite-Host hi\n")
    assert resolve_shell("bash", path).script("echo hi") == "echo hi"


def test_custom_templates(tmp_path: Path) -> None:
    path = _bin(tmp_path, "perl", "bash")
    perl = resolve_shell("perl {0}", path)
    assert perl.argv("/s") == [f"{path}/perl", "/s"] and perl.extension == ""
    traced = resolve_shell("bash -x {0}", path)
    assert traced.argv("/s.sh") == [f"{path}/bash", "-x", "/s.sh"] and traced.extension == ".sh"
    absolute = resolve_shell(f"{path}/perl -w {{0}}", "")
    assert absolute.argv("/s") == [f"{path}/perl", "-w", "/s"]


def test_unusable_shells_are_refused(tmp_path: Path) -> None:
    path = _bin(tmp_path, "perl")
    with pytest.raises(ShellError, match="format string containing"):
        resolve_shell("perl -w", path)
    with pytest.raises(ShellError, match="only on Windows"):
        resolve_shell("cmd", path)
    with pytest.raises(ShellError, match="`zsh` was not found"):
        resolve_shell("zsh {0}", path)
    with pytest.raises(ShellError, match="`pwsh` was not found"):
        resolve_shell("pwsh", path)


def test_real_default_shell_runs() -> None:
    shell = resolve_shell(None, os.environ.get("PATH", os.defpath))
    assert os.path.basename(shell.executable) in ("bash", "sh")
