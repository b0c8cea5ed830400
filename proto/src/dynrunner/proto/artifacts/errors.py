"""Artifact failures. Every message is meant for the job log: it names the artifact, path or job."""

from __future__ import annotations


class ArtifactError(Exception):
    """An artifact cannot be uploaded, found, fetched or staged; the step fails with this message."""


class ScopeError(ArtifactError):
    """A ref points outside the job's repository (or at another driver)."""


class StagingError(ArtifactError):
    """Unsafe or corrupt content, or an unsafe destination: nothing was written at the destination."""
