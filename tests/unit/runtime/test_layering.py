"""The runtime library depends on `dynrunner.proto` and third-party libraries only, never on the rest of
the executor (the engine and the `artifact` CLI both build on it), and boto3 loads only with the S3 driver."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from dynrunner.executor import runtime

PACKAGE = Path(runtime.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_runtime_imports_nothing_else_from_the_executor() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        bad = {
            module
            for module in imported_modules(path)
            if (
                module.startswith("dynrunner.")
                and not module.startswith(("dynrunner.executor.runtime", "dynrunner.proto"))
            )
            or module.startswith("dynrunner.proto._gen")
        }
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = sorted(bad)
    assert offenders == {}


def test_boto3_is_imported_only_when_s3_is_used() -> None:
    code = (
        "import sys, dynrunner.executor.runtime, dynrunner.executor.runtime.cli; "
        "print('boto3' in sys.modules, 'botocore' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_a_job_loads_the_artifact_machinery_only_when_it_uses_artifacts() -> None:
    """`dynrunner-executor run` imports what every job needs; archives, stores and staging load
    when a job first publishes or imports an artifact (they cost start-up time otherwise)."""
    lazy = [
        "tarfile",
        "dynrunner.executor.runtime.artifacts.collect",
        "dynrunner.executor.runtime.artifacts.store",
        "dynrunner.executor.runtime.artifacts.staging",
        "dynrunner.executor.hashfiles",
        "dynrunner.executor.identity",
    ]
    code = f"import sys, dynrunner.executor.run; print([m for m in {lazy!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
