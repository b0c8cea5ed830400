"""The job-local workspace on the environment's workspace volume.

    <root>/
      .dynrunner/                 runtime-owned (0700): job state, per-step files and scripts
        bin/dynrunner-executor    a launcher of this executor, last on the steps' PATH
        job.json                  what `dynrunner-executor artifact` needs to act for this job
        steps/<n>[-<attempt>]/    one per step that starts, numbered in order
          scripts/  output env path state summary  artifacts/
      workspace/<owner>/<repo>/   GITHUB_WORKSPACE, shared by every step of the job
      temp/                       RUNNER_TEMP
      tool-cache/                 RUNNER_TOOL_CACHE

Runtime-owned files sit beside GITHUB_WORKSPACE, not in it, so a step that cleans or checks out
into the workspace (actions/checkout empties it) cannot remove them, and they never overwrite
anything a step shares on purpose. Deleting the environment deletes all of it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from dynrunner.executor.runtime.repository import Repository

RUNTIME_DIR_NAME = ".dynrunner"
CLI_NAME = "dynrunner-executor"
LAUNCHERS = {CLI_NAME: "dynrunner.executor.cli", "dynrunner-identity": "dynrunner.executor.identity_cli"}
"""The commands every step finds on PATH (at its end), whatever the environment installed."""
RUNTIME_DIR_ENV = "DYNRUNNER_RUNTIME_DIR"
"""Names the job's runtime directory to `dynrunner-executor artifact` running inside a step."""

_ATTEMPT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Workspace:
    root: Path
    path: Path
    runtime_dir: Path
    temp_dir: Path
    tool_cache: Path

    @property
    def bin_dir(self) -> Path:
        """Holds only the `dynrunner-executor` and `dynrunner-identity` launchers, so steps find them on PATH
        without the executor's own installation (its Python, pip, ...) shadowing the job's tools."""
        return self.runtime_dir / "bin"

    @classmethod
    def at(cls, root: Path, repository: Repository) -> Workspace:
        root = Path(os.path.realpath(root))
        return cls(
            root=root,
            path=root / "workspace" / repository.owner / repository.name,
            runtime_dir=root / RUNTIME_DIR_NAME,
            temp_dir=root / "temp",
            tool_cache=root / "tool-cache",
        )

    @classmethod
    def create(cls, root: Path, repository: Repository) -> Workspace:
        ws = cls.at(root, repository)
        ws.root.mkdir(parents=True, exist_ok=True)
        ws.runtime_dir.mkdir(mode=0o700, exist_ok=True)
        os.chmod(ws.runtime_dir, 0o700)
        for directory in (ws.path, ws.temp_dir, ws.tool_cache, ws.runtime_dir / "steps", ws.bin_dir):
            directory.mkdir(parents=True, exist_ok=True)
        for name, module in LAUNCHERS.items():
            launcher = ws.bin_dir / name
            launcher.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m {module} "$@"\n')
            launcher.chmod(0o755)
        return ws

    def step_files(self, step_index: int, attempt: str = "") -> StepFiles:
        """Fresh, empty files for one step. Another attempt of the same step gets its own directory
        when it passes a distinct `attempt` (e.g. "post"); the same pair again starts over empty."""
        if step_index < 0:
            raise ValueError(f"step index {step_index} is negative")
        if attempt and not _ATTEMPT_RE.fullmatch(attempt):
            raise ValueError(f"step attempt {attempt!r} must be 1-64 letters, digits, '.', '-' or '_'")
        name = f"{step_index}-{attempt}" if attempt else str(step_index)
        directory = self.runtime_dir / "steps" / name
        try:
            directory.mkdir()
        except FileExistsError:
            if directory.is_dir() and not directory.is_symlink():
                shutil.rmtree(directory)
            else:
                directory.unlink()
            directory.mkdir()
        files = StepFiles(
            directory=directory,
            runtime_dir=self.runtime_dir,
            script_dir=directory / "scripts",
            output=directory / "output",
            env=directory / "env",
            path=directory / "path",
            state=directory / "state",
            summary=directory / "summary",
            artifacts_dir=directory / "artifacts",
        )
        files.script_dir.mkdir()
        files.artifacts_dir.mkdir()
        for file in (files.output, files.env, files.path, files.state, files.summary):
            os.close(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
        return files


@dataclass(frozen=True, slots=True)
class StepFiles:
    directory: Path
    runtime_dir: Path
    script_dir: Path
    output: Path
    env: Path
    path: Path
    state: Path
    summary: Path
    artifacts_dir: Path
    """This step's own KRUNTIME_ARTIFACTS_DIR: what is in it after the step succeeds is uploaded."""

    @property
    def key(self) -> str:
        """Identifies the step within the job (its directory name)."""
        return self.directory.name

    def env_vars(self) -> dict[str, str]:
        output, env, path = str(self.output), str(self.env), str(self.path)
        return {
            "GITHUB_OUTPUT": output,
            "GITHUB_ENV": env,
            "GITHUB_PATH": path,
            "GITHUB_STATE": str(self.state),
            "GITHUB_STEP_SUMMARY": str(self.summary),
            "GITEA_OUTPUT": output,
            "GITEA_ENV": env,
            "GITEA_PATH": path,
            "KRUNTIME_OUTPUTS": output,
            "KRUNTIME_ARTIFACTS_DIR": str(self.artifacts_dir),
            RUNTIME_DIR_ENV: str(self.runtime_dir),
        }
