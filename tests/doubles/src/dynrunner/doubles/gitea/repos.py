"""Repositories with content: rows in the database, bare git repositories on disk.

Repositories also come into being implicitly (a submitted run, a repository-scoped
registration token): those are public, on branch `main`, and empty until a test commits.
`create` makes one explicitly, like Gitea's "New Repository" (public unless `private`;
an existing name is refused, as Gitea's API answers 409).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dynrunner.doubles.gitea import runners as runner_db
from dynrunner.doubles.gitea.gitrepos import Commit, GitRepositories, check_ref_name
from dynrunner.doubles.gitea.store import Clock, Row, Store


class RepositoryExists(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RepoView:
    id: int
    full_name: str
    private: bool
    default_branch: str
    clone_url: str
    refs: dict[str, str]


def find(conn: sqlite3.Connection, owner: str, name: str) -> Row | None:
    """The repository `owner/name`, ignoring case as Gitea's `lower_name` lookups do."""
    row: Row | None = conn.execute(
        "SELECT repository.*, owner.name AS owner_name FROM repository JOIN owner ON owner.id = repository.owner_id "
        "WHERE lower(owner.name) = lower(?) AND lower(repository.name) = lower(?)",
        (owner, name),
    ).fetchone()
    return row


def owner_exists(conn: sqlite3.Connection, owner: str) -> bool:
    return conn.execute("SELECT 1 FROM owner WHERE lower(name) = lower(?)", (owner,)).fetchone() is not None


class Repositories:
    def __init__(self, store: Store, git: GitRepositories, clock: Clock) -> None:
        self.store = store
        self.git = git
        self.clock = clock
        self.root_url = "http://localhost/"

    def create(self, full_name: str, *, private: bool = False, default_branch: str = "main") -> RepoView:
        owner, name = runner_db.split_repository(full_name)
        check_ref_name(default_branch, "branch")
        with self.store.write() as conn:
            if find(conn, owner, name) is not None:
                raise RepositoryExists(f"The repository with the same name already exists: {full_name}")
            _, repo_id = runner_db.ensure_repository(conn, full_name)
            conn.execute(
                "UPDATE repository SET is_private = ?, default_branch = ? WHERE id = ?",
                (int(private), default_branch, repo_id),
            )
        self.git.ensure(owner, name, default_branch)
        return self.view(full_name)

    def commit(
        self,
        full_name: str,
        files: Mapping[str, str | bytes],
        *,
        branch: str | None = None,
        message: str = "commit from a test",
        executable: Iterable[str] = (),
        delete: Iterable[str] = (),
        replace: bool = False,
        tags: Iterable[str] = (),
    ) -> Commit:
        """Commit `files` (path → text or bytes) on `branch` (default: the repository's default
        branch, created if new), and point each of `tags` at the commit. `executable` paths get
        mode 100755, `delete` paths go away, `replace` makes the tree exactly `files`."""
        row = self._row(full_name)
        return self.git.commit(
            row["owner_name"],
            row["name"],
            row["default_branch"],
            files,
            branch=branch or row["default_branch"],
            message=message,
            when=self.clock.now(),
            executable=executable,
            delete=delete,
            replace=replace,
            tags=tags,
        )

    def head(self, full_name: str, ref: str) -> str:
        """The commit `ref` names in the repository, or '' (no such repository or ref)."""
        owner, name = runner_db.split_repository(full_name)
        return self.git.resolve(owner, name, ref)

    def settings(self, full_name: str) -> tuple[bool, str]:
        """(private, default branch); a repository not created yet will be public, on `main`."""
        owner, name = runner_db.split_repository(full_name)
        with self.store.read() as conn:
            row = find(conn, owner, name)
        return (bool(row["is_private"]), str(row["default_branch"])) if row is not None else (False, "main")

    def view(self, full_name: str) -> RepoView:
        row = self._row(full_name)
        owner, name = row["owner_name"], row["name"]
        return RepoView(
            id=row["id"],
            full_name=f"{owner}/{name}",
            private=bool(row["is_private"]),
            default_branch=row["default_branch"],
            clone_url=f"{self.root_url}{owner}/{name}.git",
            refs=self.git.refs(owner, name),
        )

    def _row(self, full_name: str) -> Row:
        owner, name = runner_db.split_repository(full_name)
        with self.store.read() as conn:
            row = find(conn, owner, name)
        if row is None:
            raise KeyError(f"repository {full_name} does not exist")
        return row
