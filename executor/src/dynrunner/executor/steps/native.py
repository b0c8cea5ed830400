"""Steps the executor implements itself.

`uses: dynrunner://artifact-import` with `with: {from: jobs.<job>.artifacts.<name>, path: <rel>}`
stages an artifact published by a direct need into the workspace (the runtime library does
the work and the safety checks). The import stops as soon as the step is told to stop
(a cancel, a timeout, the deadline): a long transfer does not wait out the stop graces.
"""

from __future__ import annotations

import asyncio

from dynrunner.executor.runtime import ArtifactError
from dynrunner.executor.steps.base import StepRun

ARTIFACT_IMPORT = "dynrunner://artifact-import"


def with_block(run: StepRun, title: str) -> None:
    """The header of a step that runs no script: its title and `with:` inputs, folded."""
    run.log(f"##[group]{title}")
    if run.with_:
        run.log("with:")
        for key, value in run.with_.items():
            run.log(f"  {key}: {value}")
    run.log("##[endgroup]")


async def artifact_import(run: StepRun) -> bool:
    with_block(run, f"Run {ARTIFACT_IMPORT}")
    source = str(run.with_.get("from", "")).strip()
    path = str(run.with_.get("path", "")).strip()
    missing = [name for name, value in (("from", source), ("path", path)) if not value]
    if missing:
        run.log(
            f"##[error]`uses: {ARTIFACT_IMPORT}` needs `with: {' and '.join(missing)}` "
            "(from: jobs.<job-id>.artifacts.<name>, path: a path relative to the workspace)"
        )
        return False
    unknown = sorted(set(run.with_) - {"from", "path"})
    if unknown:
        run.log(f"##[error]`uses: {ARTIFACT_IMPORT}` has unknown inputs: {', '.join(unknown)} (it takes from and path)")
        return False
    importing = asyncio.ensure_future(run.runtime.import_artifact(source, path, run.log))
    stopping = asyncio.ensure_future(run.stop.event.wait())
    try:
        await asyncio.wait({importing, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not importing.done():
            importing.cancel()  # the transfer's thread stops and cleans up before this returns
            await asyncio.wait({importing})
    if importing.cancelled():
        return False  # stopped: the job loop knows why
    try:
        importing.result()
    except (ArtifactError, ValueError) as err:
        run.log(f"##[error]{err}")
        return False
    return True
