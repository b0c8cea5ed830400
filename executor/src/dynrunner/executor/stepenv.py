"""The process environment of a step, layer by layer.

From lowest to highest: the executor's environment and CI, the env context (workflow, job,
GITHUB_ENV), the other variables a Gitea runner sets (GITEA_*, ACTIONS_*), the step's
`env:` (with the `env:` of the step that called a composite action under it), the runner's
GITHUB_* and RUNNER_* (not overwritable, as on GitHub, whose runner sets them from its
contexts last), GITHUB_ACTION and the action's GITHUB_ACTION_PATH, _REPOSITORY and _REF,
the step's file variables; then `GITHUB_PATH` entries in front of PATH (the latest first)
and the job's `.dynrunner/bin` at its end.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dynrunner.executor.runtime import StepFiles

_FIXED = ("GITHUB_", "RUNNER_")  # the runner's variables a workflow cannot overwrite (GitHub's docs)


class StepEnvironment:
    def __init__(self, base_env: Mapping[str, str], runner_env: Mapping[str, str], bin_dir: Path) -> None:
        # GitHub documents that the GITHUB_* and RUNNER_* variables the runner sets cannot be
        # overwritten, and that CI can.
        self.base = {**base_env, "CI": runner_env.get("CI", "true")}
        self.runner = {k: v for k, v in runner_env.items() if k != "CI" and not k.startswith(_FIXED)}
        self.fixed = {k: v for k, v in runner_env.items() if k.startswith(_FIXED)}
        self.bin_dir = str(bin_dir)
        self.prepend_path: list[str] = []

    def add_path(self, entries: list[str]) -> None:
        """`GITHUB_PATH` entries of a finished step: in front of PATH for every later step."""
        for entry in entries:
            if entry in self.prepend_path:
                self.prepend_path.remove(entry)
            self.prepend_path.append(entry)

    def build(
        self,
        *,
        env_context: Mapping[str, str],
        step_env: Mapping[str, str],
        action: str,
        action_vars: Mapping[str, str],
        files: StepFiles | None,
    ) -> dict[str, str]:
        env = dict(self.base)
        env.update(env_context)
        env.update(self.runner)
        env.update(step_env)
        env.update(self.fixed)
        env["GITHUB_ACTION"] = action
        if action_vars:
            env.update(action_vars)
        if files is not None:
            step_files = files.env_vars()
            step_files.setdefault("GITEA_STATE", step_files["GITHUB_STATE"])
            step_files.setdefault("GITEA_STEP_SUMMARY", step_files["GITHUB_STEP_SUMMARY"])
            env.update(step_files)
        path = env.get("PATH")
        if self.prepend_path:
            front = os.pathsep.join(reversed(self.prepend_path))
            path = f"{front}{os.pathsep}{path}" if path else front
        # Last, so an installed dynrunner-executor (the image's) is found first.
        env["PATH"] = f"{path}{os.pathsep}{self.bin_dir}" if path else self.bin_dir
        return env
