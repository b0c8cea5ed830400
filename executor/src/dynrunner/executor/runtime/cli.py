"""`dynrunner-executor artifact`: import and list job-to-job artifacts from inside a `run:` step.

The step's environment names the job's runtime directory (DYNRUNNER_RUNTIME_DIR, set with the
other step variables), which holds what the job knows: its workspace, store and needs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from dynrunner.executor.runtime.artifacts.errors import ArtifactError
from dynrunner.executor.runtime.job import JobRuntime
from dynrunner.executor.runtime.repository import RepositoryError
from dynrunner.executor.runtime.workspace import RUNTIME_DIR_ENV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="artifact_command", required=True)
    imp = sub.add_parser(
        "import",
        help="stage an artifact of a job this job needs",
        description="Stage FROM (jobs.<job-id>.artifacts.<name>) at PATH, relative to the current directory, "
        "which must be inside the workspace.",
    )
    imp.add_argument("from_", metavar="FROM", help="jobs.<job-id>.artifacts.<name>")
    imp.add_argument("path", metavar="PATH", help="relative destination path")
    lst = sub.add_parser("list", help="list the artifacts this job's needs published")
    lst.add_argument("--json", action="store_true", help="print one JSON ref per line")


def main(args: argparse.Namespace) -> int:
    runtime_dir = os.environ.get(RUNTIME_DIR_ENV)
    if not runtime_dir:
        print(f"error: {RUNTIME_DIR_ENV} is not set; run this inside a step of a dynrunner job", file=sys.stderr)
        return 2
    try:
        runtime = JobRuntime.load(Path(runtime_dir))
        if args.artifact_command == "import":
            asyncio.run(runtime.import_artifact(args.from_, args.path, _print, cwd=Path.cwd()))
        else:
            _list(runtime, as_json=args.json)
    except (ArtifactError, RepositoryError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _list(runtime: JobRuntime, *, as_json: bool) -> None:
    refs = runtime.list_artifacts()
    if as_json:
        for ref in refs:
            print(json.dumps({"job": ref.job, **ref.to_json()}, separators=(",", ":")))
        return
    if not refs:
        needs = ", ".join(sorted(runtime.needs)) or "none"
        print(f"no artifacts (needs: {needs})")
        return
    rows = [("JOB", "NAME", "TYPE", "SIZE", "DIGEST")]
    rows += [(r.job, r.name, r.type.value, str(r.size), r.digest) for r in refs]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])


def _print(line: str) -> None:
    print(line, flush=True)
