"""What a step leaves in its environment files, read after it ends (whatever its result),
as GitHub's runner reads them (`FileCommandManager`).

- GITHUB_OUTPUT: the step's outputs, bounded by the runtime library's limits.
- GITHUB_ENV: variables for every later step. `NODE_OPTIONS` is refused, as on GitHub.
- GITHUB_PATH: one directory per line, put in front of PATH for later steps (the latest first).
- GITHUB_STATE: kept per step (for the `post` phase of actions).
- GITHUB_STEP_SUMMARY: Gitea keeps no step summaries through this runner's protocol, so the
  summary is shown in the step's log instead, in a `Step summary` group; over 1 MiB it is
  refused with GitHub's message.

Problems are collected as log rows; `failed` says whether the step must fail because of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dynrunner.executor.runtime import JobRuntime, StepFiles
from dynrunner.executor.runtime.envfile import EnvFileError, parse_env_file
from dynrunner.executor.runtime.outputs import OutputLimitError, check_output

SUMMARY_LIMIT = 1024 * 1024
ENV_FILE_LIMIT = 64 * 1024 * 1024
BLOCKED_ENV = frozenset({"NODE_OPTIONS"})


@dataclass(slots=True)
class FileEffects:
    outputs: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)
    state: dict[str, str] = field(default_factory=dict)
    rows: list[str] = field(default_factory=list)
    failed: bool = False

    def error(self, message: str, *, fail: bool = True) -> None:
        self.rows.append(f"##[error]{message}")
        self.failed = self.failed or fail


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read(path: Path, effects: FileEffects, source: str) -> bytes:
    size = _size(path)
    if size > ENV_FILE_LIMIT:
        effects.error(f"${source} is {size} bytes; this runner reads at most {ENV_FILE_LIMIT} bytes of it")
        return b""
    if not size:
        return b""
    with path.open("rb") as fp:
        return fp.read(ENV_FILE_LIMIT)  # a file still growing (a background writer) stays bounded


def read_step_files(runtime: JobRuntime, files: StepFiles, command_outputs: dict[str, str]) -> FileEffects:
    effects = FileEffects()
    outputs = dict(command_outputs)
    try:
        for name, value in command_outputs.items():
            check_output(name, value, runtime.limits)
        outputs.update(runtime.read_outputs(files))
    except (OutputLimitError, EnvFileError) as err:
        effects.error(str(err))
    effects.outputs = outputs

    for source, target in (("GITHUB_ENV", effects.env), ("GITHUB_STATE", effects.state)):
        data = _read(files.env if source == "GITHUB_ENV" else files.state, effects, source)
        if not data:
            continue
        try:
            pairs = parse_env_file(data, source=source)
        except EnvFileError as err:
            effects.error(str(err))
            continue
        for name, value in pairs:
            if source == "GITHUB_ENV" and name.upper() in BLOCKED_ENV:
                effects.error(f"Can't store {name.upper()} output parameter using '$GITHUB_ENV' command.", fail=False)
                continue
            if source == "GITHUB_ENV" and "\0" in name + value:
                # A process environment cannot hold a NUL: every later step would fail to start.
                effects.error(f"${source}: variable '{name.replace(chr(0), '')}' contains a NUL character")
                continue
            target[name] = value

    for raw in _read(files.path, effects, "GITHUB_PATH").decode("utf-8", "replace").split("\n"):
        entry = raw.rstrip("\r")
        if "\0" in entry:
            effects.error("$GITHUB_PATH: an entry contains a NUL character")
        elif entry:
            effects.path.append(entry)

    size = _size(files.summary)
    summary = b""
    if size > SUMMARY_LIMIT:  # refused before it is read: a big summary never sits in memory
        effects.error(
            f"$GITHUB_STEP_SUMMARY upload aborted, supports content up to a size of {SUMMARY_LIMIT // 1024}k, "
            f"got {size // 1024}k.",
            fail=False,
        )
    elif size:
        with files.summary.open("rb") as fp:
            summary = fp.read(SUMMARY_LIMIT)
    if summary.strip():
        effects.rows.append("##[group]Step summary")
        effects.rows.extend(summary.decode("utf-8", "replace").rstrip("\n").split("\n"))
        effects.rows.append("##[endgroup]")
    return effects
