"""The executor's runtime library: job-local workspace, environment files, bounded outputs and
job-to-job artifacts. It depends on `dynrunner.proto` and third-party libraries only, never on the
rest of the executor, so the engine and the `artifact` CLI share it without cycles."""

from dynrunner.executor.runtime.artifacts.errors import ArtifactError, ScopeError, StagingError
from dynrunner.executor.runtime.artifacts.refs import ARTIFACTS_OUTPUT_KEY, ArtifactRef, ArtifactType
from dynrunner.executor.runtime.job import JobRuntime
from dynrunner.executor.runtime.repository import RepositoryError
from dynrunner.executor.runtime.workspace import StepFiles, Workspace

__all__ = [
    "ARTIFACTS_OUTPUT_KEY",
    "ArtifactError",
    "ArtifactRef",
    "ArtifactType",
    "JobRuntime",
    "RepositoryError",
    "ScopeError",
    "StagingError",
    "StepFiles",
    "Workspace",
]
