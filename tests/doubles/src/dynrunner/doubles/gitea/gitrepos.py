"""Git storage of the double's repositories: one bare repository per Gitea repository.

Gitea keeps `<REPO_ROOT>/<owner>/<name>.git` bare repositories and serves them with the
real `git` (`upload-pack --stateless-rpc`). So does the double. Tests put content in with
`commit()`: one `git fast-import` run writes the blobs, the tree, the commit, the branch
and any tags, so a commit costs one process whatever the number of files.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

_REF_NAME = re.compile(r"^(?!/)(?!.*(?:\.\.|//|@\{|\.lock(?:/|$)))[^\x00-\x20~^:?*\[\\\x7f]+(?<![/.])$")
IDENTITY = ("Gitea Double", "double@gitea.invalid")


def check_ref_name(name: str, what: str) -> str:
    """`git check-ref-format` rules for a branch or tag name (ValueError otherwise)."""
    if not _REF_NAME.match(name) or any(part.startswith(".") for part in name.split("/")):
        raise ValueError(f"invalid {what} name {name!r}")
    return name


def _check_path(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..", ".git") for p in parts) or "\n" in path:
        raise ValueError(f"invalid file path {path!r} (relative, no '.', '..' or '.git' components)")
    return path


@dataclass(frozen=True, slots=True)
class Commit:
    sha: str
    branch: str
    tags: tuple[str, ...]


class GitRepositories:
    """Bare repositories under `root`, created on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def path(self, owner: str, name: str) -> Path:
        return self.root / owner.lower() / f"{name.lower()}.git"

    def _lock(self, path: Path) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(str(path), threading.Lock())

    def ensure(self, owner: str, name: str, default_branch: str) -> Path:
        """The repository's bare directory, initialised (HEAD on `default_branch`) if new."""
        path = self.path(owner, name)
        with self._lock(path):
            if not (path / "HEAD").exists():
                path.mkdir(parents=True, exist_ok=True)
                _git(path, "init", "--quiet", "--bare", f"--initial-branch={default_branch}", ".")
                _git(path, "config", "uploadpack.allowFilter", "true")
                _git(path, "config", "uploadpack.allowAnySHA1InWant", "true")
        return path

    def commit(
        self,
        owner: str,
        name: str,
        default_branch: str,
        files: Mapping[str, str | bytes],
        *,
        branch: str,
        message: str,
        when: int,
        executable: Iterable[str] = (),
        delete: Iterable[str] = (),
        replace: bool = False,
        tags: Iterable[str] = (),
    ) -> Commit:
        """One commit on `branch` (created from nothing if new) changing `files`; `replace`
        makes the tree exactly `files`. Each tag (lightweight) is set to the commit."""
        check_ref_name(branch, "branch")
        tag_list = tuple(check_ref_name(t, "tag") for t in tags)
        executable = set(executable)
        path = self.ensure(owner, name, default_branch)
        script = bytearray()
        identity = f"{IDENTITY[0]} <{IDENTITY[1]}> {when} +0000"
        body = message.encode()
        script += f"commit refs/heads/{branch}\nmark :1\n".encode()
        script += f"author {identity}\ncommitter {identity}\n".encode()
        script += b"data %d\n%s\n" % (len(body), body)
        with self._lock(path):
            parent = self.resolve(owner, name, f"refs/heads/{branch}")
            if parent:
                script += f"from {parent}\n".encode()
            if replace:
                script += b"deleteall\n"
            for gone in delete:
                script += f"D {_check_path(gone)}\n".encode()
            for file_path, content in sorted(files.items()):
                data = content.encode() if isinstance(content, str) else bytes(content)
                mode = "100755" if file_path in executable else "100644"
                script += f"M {mode} inline {_check_path(file_path)}\n".encode()
                script += b"data %d\n%s\n" % (len(data), data)
            for tag in tag_list:
                script += f"reset refs/tags/{tag}\nfrom :1\n\n".encode()
            _git(path, "fast-import", "--quiet", "--force", stdin=bytes(script))
            sha = self.resolve(owner, name, f"refs/heads/{branch}")
        assert sha, "fast-import wrote no commit"
        return Commit(sha=sha, branch=branch, tags=tag_list)

    def resolve(self, owner: str, name: str, ref: str) -> str:
        """The commit a ref names, or '' (no repository, no such ref)."""
        path = self.path(owner, name)
        if not (path / "HEAD").exists():
            return ""
        result = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            cwd=path,
            env=git_env(),
            capture_output=True,
            check=False,
        )
        return result.stdout.decode().strip() if result.returncode == 0 else ""

    def refs(self, owner: str, name: str) -> dict[str, str]:
        """Every branch and tag: full ref name → commit."""
        path = self.path(owner, name)
        if not (path / "HEAD").exists():
            return {}
        out = _git(path, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads", "refs/tags")
        return dict(line.split(" ", 1) for line in out.decode().splitlines() if line)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment for server-side git: no user or system configuration, no prompts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_TERMINAL_PROMPT="0")
    env.update(extra or {})
    return env


def _git(path: Path, *args: str, stdin: bytes | None = None) -> bytes:
    result = subprocess.run(["git", *args], cwd=path, env=git_env(), input=stdin, capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed in {path}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout
