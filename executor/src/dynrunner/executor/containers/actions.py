"""Container actions with podman: `docker://image` and `runs.using: docker` (image or Dockerfile).

`podman run --rm` in the job's network (its services are reachable), the job's root mounted
at the same path and the workspace as working directory, the variables `stages.container_env`
chose handed over by name only (`--env NAME`: values never on a command line). A Dockerfile is
built once per job and content (tag `localhost/dynrunner-action/<digest>`) and removed when
the job ends. Output streams and
cancellation are a local step's: podman forwards SIGINT/SIGTERM to the container.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dynrunner.executor.containers.podman import LABEL, Podman
from dynrunner.executor.containers.spec import image_problem
from dynrunner.executor.steps.base import StepRun
from dynrunner.executor.steps.process import run_process


def build_tag(build_dir: Path, dockerfile: str) -> str:
    """A tag for the image built from `dockerfile`: changes with its content and directory."""
    digest = hashlib.sha256(str(build_dir).encode() + b"\0" + (build_dir / dockerfile).read_bytes()).hexdigest()
    return f"localhost/dynrunner-action/{digest[:20]}"


class PodmanImages:
    """`ContainerImages` (steps/base.py) through podman."""

    def __init__(self, podman: Podman, *, root: Path, workspace: Path, label: str, network: Callable[[], str]) -> None:
        self.podman = podman
        self.root = root
        self.workspace = workspace
        self.label = label
        self.network = network
        self.built: set[str] = set()

    async def _stream(self, run: StepRun, args: Sequence[str], env: Mapping[str, str]) -> tuple[int, bool]:
        return await run_process(
            [*self.podman.config.argv, *args],
            env={**os.environ, **env},
            cwd=str(self.workspace),
            on_lines=run.output,
            stop=run.stop.event,
            timings=run.timings,
            backpressure=run.backpressure,
        )

    async def run_image(
        self,
        run: StepRun,
        *,
        image: str,
        build_dir: Path | None,
        dockerfile: str,
        entrypoint: str,
        args: Sequence[str],
        env: Mapping[str, str],
    ) -> bool:
        if build_dir is None and (problem := image_problem(image)):
            run.log(f"##[error]The action's image cannot be run: {problem}.")
            return False
        if build_dir is not None:
            tag = build_tag(build_dir, dockerfile)
            if tag not in self.built:
                code, _, _ = await self.podman.call("image", "exists", tag, limit_s=60)
                if code != 0:
                    run.log(f"Building the action's image from {dockerfile}")
                    build = [
                        "build",
                        *self._ulimits(),
                        "--tag",
                        tag,
                        "--file",
                        str(build_dir / dockerfile),
                        str(build_dir),
                    ]
                    code, stopped = await self._stream(run, build, {})
                    if code != 0 or stopped:
                        if not stopped:
                            run.log(
                                f"##[error]The action's image could not be built from {dockerfile} (exit code {code})."
                            )
                        return False
                self.built.add(tag)
            image = tag
        else:
            code, _, _ = await self.podman.call("image", "exists", image, limit_s=60)
            if code != 0:
                run.log(f"Pulling image {image}")
                code, _, err = await self.podman.call("pull", "--quiet", image, limit_s=1800)
                if code != 0:
                    run.log(f"##[error]The action's image {image} could not be pulled: {err.strip()[-1500:]}")
                    return False
        network = self.network()
        argv = [
            "run",
            "--rm",
            "--label",
            f"{LABEL}={self.label}",
            *self.podman.config.run_options,
            "--volume",
            f"{self.root}:{self.root}",
            "--workdir",
            str(self.workspace),
            *([f"--network={network}"] if network else []),
            *([f"--entrypoint={entrypoint}"] if entrypoint else []),
        ]
        for key in env:
            argv += ["--env", key]
        argv += [image, *args]
        try:
            code, stopped = await self._stream(run, argv, env)
        except (OSError, ValueError) as err:
            run.log(f"##[error]podman could not be started: {err}")
            return False
        if code != 0 and not stopped:
            run.log(f"##[error]Process completed with exit code {code}.")
        return code == 0 and not stopped

    async def aclose(self) -> None:
        """Remove the images this job built: their tags hold the job's own path, so no later
        job would use them, and a long-lived machine (a local pool) must not collect them."""
        if self.built:
            await self.podman.call("rmi", "--force", *sorted(self.built), limit_s=120)
            self.built.clear()

    def _ulimits(self) -> list[str]:
        """`podman build` takes the run options' ulimits (its RUN steps need them on such machines)."""
        options = list(self.podman.config.run_options)
        return [opt for i, opt in enumerate(options) if opt == "--ulimit" or (i and options[i - 1] == "--ulimit")]
