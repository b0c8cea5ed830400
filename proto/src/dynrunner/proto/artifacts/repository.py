"""The repository a job belongs to: where its workspace lives and which part of the artifact store it may reach."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_RUN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class RepositoryError(ValueError):
    """`github.repository` or `github.run_id` cannot be used to build paths safely."""


@dataclass(frozen=True, slots=True)
class Repository:
    owner: str
    name: str

    @classmethod
    def parse(cls, repository: str) -> Repository:
        owner, sep, name = repository.partition("/")
        if not sep or not _safe(owner) or not _safe(name):
            raise RepositoryError(
                f"repository {repository!r} is not of the form 'owner/name' with names made of letters, digits, "
                "'.', '-' and '_'"
            )
        return cls(owner, name)

    @property
    def scope(self) -> str:
        """The repository's part of an artifact store, `owner/name` lowercased: Gitea names are case-insensitive,
        so one repository must never get two scopes."""
        return f"{self.owner.lower()}/{self.name.lower()}"

    def __str__(self) -> str:
        return f"{self.owner}/{self.name}"


def check_run_id(run_id: str) -> str:
    if not _RUN_RE.fullmatch(run_id):
        raise RepositoryError(f"run id {run_id!r} must be 1-64 letters, digits, '-' or '_'")
    return run_id


def _safe(part: str) -> bool:
    return bool(_NAME_RE.fullmatch(part)) and part not in {".", ".."} and len(part) <= 255
