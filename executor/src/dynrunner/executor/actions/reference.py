"""What a step's `uses:` names, and whom the task token may be sent to when fetching it.

Forms (as Gitea's runner reads them):

- `./path` — an action in the workspace (usually the repository a checkout step fetched);
- `docker://image` — a container image;
- `owner/repo[/path]@ref` — an action repository on the instance Gitea names in the task's
  `gitea_default_actions_url` context: `https://github.com` ([actions] DEFAULT_ACTIONS_URL =
  github, Gitea's default) or the Gitea instance itself (= self, Gitea's ROOT_URL);
- `https://host/owner/repo[/path]@ref` or `http://...` — an action repository on any host. When
  the URL starts with the Gitea instance's own URL (which may have a sub-path), the rest is
  `owner/repo[/path]`.

`ref` is a tag, a branch or a full commit SHA.

The task token authenticates fetches from the Gitea instance only: the repository URL's
scheme, host and port must equal those of the Gitea URL the executor reports to or of
Gitea's own ROOT_URL (`github.server_url` as Gitea sent it), and it must carry no user
info. act_runner compares the host alone; a different scheme or port is another server here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

GITHUB_URL = "https://github.com"
_REMOTE_RE = re.compile(r"^([^/@]+)/([^/@]+)(?:/([^@]*))?@(.+)$")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ReferenceError(ValueError):
    """The `uses:` value names no action this runner can find; the message says why."""


@dataclass(frozen=True, slots=True)
class LocalAction:
    path: str

    def __str__(self) -> str:
        return self.path


@dataclass(frozen=True, slots=True)
class DockerAction:
    image: str

    def __str__(self) -> str:
        return f"docker://{self.image}"


@dataclass(frozen=True, slots=True)
class RemoteAction:
    base_url: str
    """Where repositories live: `https://github.com`, the Gitea instance, or another host."""
    owner: str
    repo: str
    path: str
    ref: str

    @property
    def repository(self) -> str:
        return f"{self.owner}/{self.repo}"

    @property
    def clone_url(self) -> str:
        return f"{self.base_url}/{self.owner}/{self.repo}"

    def __str__(self) -> str:
        """`owner/repo[/path]@ref`, without the host (GitHub's and Gitea's display form)."""
        where = f"{self.repository}/{self.path}" if self.path else self.repository
        return f"{where}@{self.ref}"


Reference = LocalAction | DockerAction | RemoteAction


def _remote(text: str, base_url: str, uses: str) -> RemoteAction:
    match = _REMOTE_RE.match(text)
    if match is None:
        raise ReferenceError(
            f"`uses: {uses}` names no action: expected ./path, docker://image, {{owner}}/{{repo}}[/path]@ref "
            "or https://host/{owner}/{repo}[/path]@ref"
        )
    owner, repo, path, ref = match.group(1), match.group(2), (match.group(3) or "").strip("/"), match.group(4)
    if any(part in ("", ".", "..") for part in (owner, repo, *(path.split("/") if path else []))):
        raise ReferenceError(f"`uses: {uses}` has an empty, `.` or `..` path segment")
    if ref.startswith("-"):
        raise ReferenceError(f"`uses: {uses}`: `{ref}` is no tag, branch or commit SHA (none starts with `-`)")
    return RemoteAction(base_url.rstrip("/"), owner, repo, path, ref)


def parse_uses(uses: str, *, default_actions_url: str, gitea_urls: tuple[str, ...] = ()) -> Reference:
    """The action `uses:` names. `gitea_urls`: the Gitea instance's URLs (for sub-paths)."""
    uses = uses.strip()
    if uses.startswith(("./", ".\\")) or uses == ".":
        return LocalAction(uses)
    if uses.startswith("docker://"):
        image = uses.removeprefix("docker://")
        if not image:
            raise ReferenceError(f"`uses: {uses}` names no image")
        return DockerAction(image)
    lowered = uses.lower()
    if lowered.startswith(("https://", "http://")):
        for gitea in gitea_urls:
            prefix = gitea.rstrip("/") + "/"
            if gitea and lowered.startswith(prefix.lower()):
                return _remote(uses[len(prefix) :], uses[: len(prefix) - 1], uses)
        scheme, _, rest = uses.partition("://")
        host, _, tail = rest.partition("/")
        if not host or not tail:
            raise ReferenceError(f"`uses: {uses}` names no repository on {scheme}://{host}")
        return _remote(tail, f"{scheme.lower()}://{host}", uses)
    if "://" in uses:
        raise ReferenceError(f"`uses: {uses}`: only https://, http:// and docker:// URLs name actions")
    return _remote(uses, default_actions_url or GITHUB_URL, uses)


def _origin(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None or parts.password is not None:
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def token_allowed(url: str, gitea_urls: tuple[str, ...]) -> bool:
    """Whether the task token may be sent to `url`: the same scheme, host and port as one of
    the Gitea instance's URLs, and no user info of its own."""
    target = _origin(url)
    return target is not None and any(target == _origin(gitea) for gitea in gitea_urls if gitea)
