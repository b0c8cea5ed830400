"""`run:` steps: the script in a file of the step's own script directory, run by its shell.

The header is GitHub's: a `##[group]Run <first line>` section with the script (in cyan),
the `shell:` line and the `env:` block, then the output. A non-zero exit fails the step
with `Process completed with exit code N.`
"""

from __future__ import annotations

import os

from dynrunner.executor.steps.base import StepRun
from dynrunner.executor.steps.shell import ShellError, resolve_shell, shell_programs
from dynrunner.proto.expressions import ExpressionError

SCRIPT_NAME = "run"
"""A step's script is `<its scripts directory>/run<extension>`."""
CYAN = "\x1b[36;1m"
RESET = "\x1b[0m"


def header(title: str, script: str, shell_line: str, env: dict[str, str] | None) -> list[str]:
    lines = [f"##[group]Run {title}"]
    lines += [f"{CYAN}{line}{RESET}" for line in script.splitlines()]
    lines.append(f"shell: {shell_line}")
    if env:
        lines.append("env:")
        for key, value in env.items():
            first, *rest = value.splitlines() or [""]
            lines.append(f"  {key}: {first}")
            lines += [f"    {line}" for line in rest]
    lines.append("##[endgroup]")
    return lines


def _write_script(path: str, contents: str) -> None:
    """UTF-8 without a BOM (GitHub's choice: a BOM breaks some shells)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o755)
    with os.fdopen(fd, "w", encoding="utf-8") as fp:
        fp.write(contents)


def title_of(script: str) -> str:
    for line in script.splitlines():
        if line.strip():
            return line.strip()
    return ""


async def run_script(run: StepRun) -> bool:
    try:
        script = run.interpolate(run.step.run or "")
    except ExpressionError as err:
        run.log(f"##[error]{err}")
        return False
    try:
        search = run.env.get("PATH", os.defpath)
        found = await run.processes.which(shell_programs(run.shell), search)
        shell = resolve_shell(run.shell, search, which=found.get, where=run.processes.where)
    except (ShellError, OSError) as err:
        run.log(f"##[error]{err}")
        return False
    run.log("\n".join(header(title_of(script) or run.name, script, shell.display, dict(run.env_context))) + "\n")
    assert run.files is not None
    path = run.files.script_dir / f"{SCRIPT_NAME}{shell.extension}"
    _write_script(str(path), shell.script(script))
    if not run.working_directory.is_dir():
        run.log(
            f"##[error]An error occurred trying to start process '{shell.executable}' with working directory "
            f"'{run.working_directory}'. No such file or directory"
        )
        return False
    try:
        code, stopped = await run.processes.run(
            shell.argv(str(path)),
            env=run.env,
            cwd=str(run.working_directory),
            on_lines=run.output,
            stop=run.stop.event,
            timings=run.timings,
            backpressure=run.backpressure,
        )
    except OSError as err:
        run.log(f"##[error]An error occurred trying to start process '{shell.executable}': {err.strerror or err}")
        return False
    except ValueError as err:  # a NUL or an '=' in a variable name, from `env:` or an expression
        run.log(f"##[error]An error occurred trying to start process '{shell.executable}': {err} in its environment")
        return False
    if code != 0 and not stopped:
        run.log(f"##[error]Process completed with exit code {code}.")
    return code == 0 and not stopped
