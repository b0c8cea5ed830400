"""GitHub's `shell:` rules for `run:` steps (actions/runner `ScriptHandler`, Linux).

| `shell`         | command                                        | script file |
|-----------------|------------------------------------------------|-------------|
| (none)          | `bash -e {0}`, or `sh -e {0}` without bash     | `.sh`       |
| `bash`          | `bash --noprofile --norc -e -o pipefail {0}`   | `.sh`       |
| `sh`            | `sh -e {0}`                                    | `.sh`       |
| `python`        | `python {0}`                                   | `.py`       |
| `pwsh`          | `pwsh -command ". '{0}'"`                      | `.ps1`      |
| `powershell`    | `powershell -command ". '{0}'"`                | `.ps1`      |
| `cmd`           | Windows only: refused here                     |             |
| `CMD ARGS {0}`  | a custom template: `{0}` is the script path    | by `CMD`    |

The executable is looked up on the step's PATH (with GITHUB_PATH entries in front).
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_ARGS = {
    "pwsh": "-command \". '{0}'\"",
    "powershell": "-command \". '{0}'\"",
    "bash": "--noprofile --norc -e -o pipefail {0}",
    "sh": "-e {0}",
    "python": "{0}",
}
EXTENSIONS = {"pwsh": ".ps1", "powershell": ".ps1", "bash": ".sh", "sh": ".sh", "python": ".py", "cmd": ".cmd"}


class ShellError(ValueError):
    """The step's shell cannot be used here; the message says why."""


@dataclass(frozen=True, slots=True)
class Shell:
    """A resolved shell: `executable` with `args` (a template holding `{0}`)."""

    name: str
    executable: str
    args: str

    @property
    def extension(self) -> str:
        return EXTENSIONS.get(self.name, "")

    @property
    def display(self) -> str:
        """The `shell:` line of the step header, as GitHub prints it."""
        return f"{self.executable} {self.args}"

    def argv(self, script_path: str) -> list[str]:
        return [self.executable, *(part.replace("{0}", script_path) for part in shlex.split(self.args))]

    def script(self, contents: str) -> str:
        """The file contents GitHub writes for this shell."""
        if self.name in ("pwsh", "powershell"):
            return (
                "$ErrorActionPreference = 'stop'\n"
                f"{contents}\n"
                "if ((Test-Path -LiteralPath variable:\\LASTEXITCODE)) { exit $LASTEXITCODE }"
            )
        return contents


def shell_name(shell: str | None) -> str:
    """The name that picks a shell's default arguments and script extension (`sh` by default)."""
    return os.path.basename(shell.strip().partition(" ")[0]) if shell else "sh"


def script_extension(shell: str | None) -> str:
    """The extension of the script file for a step whose effective `shell:` is `shell`."""
    return EXTENSIONS.get(shell_name(shell), "")


def _which(name: str, path: str) -> str | None:
    return shutil.which(name, path=path)


def shell_programs(shell: str | None) -> list[str]:
    """The programs `resolve_shell` may look up for `shell` (to look them up elsewhere first)."""
    return ["bash", "sh"] if not shell else [shell.strip().partition(" ")[0]]


def resolve_shell(
    shell: str | None,
    path: str,
    *,
    which: Callable[[str], str | None] | None = None,
    where: str = "this environment",
) -> Shell:
    """The shell for a step whose effective `shell:` is `shell` (None: the default); `which`
    finds a program (by default on `path` here; a job container's agent answers for it)."""
    lookup = which or (lambda name: _which(name, path))
    if not shell:
        executable = lookup("bash") or lookup("sh")
        if executable is None:
            raise ShellError(f"neither bash nor sh was found on PATH in {where}; set `shell:` to an installed shell")
        return Shell("sh", executable, DEFAULT_ARGS["sh"])
    command, _, args = shell.strip().partition(" ")
    args = args.strip()
    name = shell_name(shell)
    if name == "cmd" and not args:
        raise ShellError("shell `cmd` exists only on Windows runners; this runner runs Linux")
    if not args:
        args = DEFAULT_ARGS.get(name, "")
    if "{0}" not in args:
        raise ShellError(
            f"Invalid shell option {shell!r}. Shell must be a valid built-in (bash, sh, cmd, powershell, pwsh) "
            "or a format string containing '{0}'"
        )
    executable = lookup(command)
    if executable is None:
        raise ShellError(f"shell `{command}` was not found on PATH in {where}")
    return Shell(name, executable, args)
