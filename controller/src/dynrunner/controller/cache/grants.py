"""Cache grants: what the controller vouches for about one claimed job, for the cache server.

The cache clients authenticate with the job's `ACTIONS_RUNTIME_TOKEN` only, a JWT Gitea signs
with a key the cache server does not have. So at claim time the controller, which read the
task from Gitea, signs a grant: "the runtime token whose SHA-256 is H belongs to a job of
repository R on ref F, which may also read the caches of refs D…, until T, and its artifacts
are served by Gitea G". The executor registers its token with the grant when the job starts;
the server accepts it only if the grant carries its own HMAC (the key the controller and the
cache server share) and the token hashes to H. A grant is worthless without its token, and the
token worthless (to the cache) without its grant, which the job cannot forge.

Wire form: `dcg1.<base64url(JSON payload)>.<base64url(HMAC-SHA256(key, "dcg1." + payload))>`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from dynrunner.proto.assignment import CacheServiceOptions
from dynrunner.proto.gitea import Task

PREFIX = "dcg1"
MIN_KEY_BYTES = 32


class GrantError(ValueError):
    """A grant that is malformed, not signed with this key, expired, or not the token's."""


@dataclass(frozen=True, slots=True)
class Grant:
    repo: str
    """`owner/name`, lower-cased: the repository whose caches the job uses."""
    scope: str
    """The ref the job writes its caches under (`github.ref`)."""
    reads: tuple[str, ...]
    """The refs whose caches it may restore, in order: its own, then a pull request's base
    branch, then the default branch."""
    token_sha256: str
    task_id: int
    expires: int
    """Unix seconds: the job's deadline."""
    results_url: str
    """The Gitea whose artifact service this server forwards for the job ("" = none)."""
    repo_id: int = 0
    """Gitea's id of the repository (0: unknown, the name alone). Entries belong to the id and
    the name together, so a repository created again under a name, or transferred to it, does
    not inherit the caches of the one that had it. Last, with a default: grants signed before
    it verify (as name-only grants)."""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(grant: Grant, key: bytes) -> str:
    payload = _b64(json.dumps(asdict(grant), separators=(",", ":"), sort_keys=True).encode())
    mac = hmac.new(key, f"{PREFIX}.{payload}".encode(), hashlib.sha256).digest()
    return f"{PREFIX}.{payload}.{_b64(mac)}"


def verify(text: str, key: bytes, *, token: str, now: float) -> Grant:
    """The grant, once its MAC, its expiry and its token check out (GrantError otherwise)."""
    prefix, _, rest = text.partition(".")
    payload, _, mac = rest.partition(".")
    if prefix != PREFIX or not payload or not mac:
        raise GrantError("not a cache grant")
    expected = hmac.new(key, f"{PREFIX}.{payload}".encode(), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), expected):
            raise GrantError("the grant is not signed with this cache server's key")
        data: dict[str, Any] = json.loads(_unb64(payload))
        grant = Grant(**{**data, "reads": tuple(data["reads"])})
    except (binascii.Error, ValueError, TypeError, KeyError) as err:
        if isinstance(err, GrantError):
            raise
        raise GrantError(f"malformed grant: {err}") from None
    if grant.expires <= now:
        raise GrantError("the grant has expired")
    if not hmac.compare_digest(grant.token_sha256, token_digest(token)):
        raise GrantError("the grant was issued for another token")
    return grant


def runtime_token(task: Task) -> str:
    """The token a job's cache clients send (`ACTIONS_RUNTIME_TOKEN`): Gitea's runtime token,
    or the task token for a Gitea that sends none."""
    return str(task.context_get("gitea_runtime_token") or task.context_get("token") or "")


def grant_for_task(
    context: Mapping[str, Any], *, runtime_token: str, task_id: int, expires: int, results_url: str
) -> Grant:
    """The grant for a task, from Gitea's task context (`github`): its repository, `ref`,
    `base_ref` (pull requests), the event's `repository.default_branch` and `repository.id`
    (Gitea's task context names no repository id; its event payloads all carry the repository)."""
    repo = str(context.get("repository") or "").lower()
    ref = str(context.get("ref") or "")
    reads = [ref]
    base = str(context.get("base_ref") or "")
    event = context.get("event")
    repository = event.get("repository") if isinstance(event, Mapping) else None
    default = str(repository.get("default_branch") or "") if isinstance(repository, Mapping) else ""
    repo_id = repository.get("id") if isinstance(repository, Mapping) else None
    for branch in (base, default):
        if branch and f"refs/heads/{branch}" not in reads:
            reads.append(f"refs/heads/{branch}")
    return Grant(
        repo=repo,
        scope=ref,
        reads=tuple(r for r in reads if r),
        token_sha256=token_digest(runtime_token),
        task_id=task_id,
        expires=expires,
        results_url=results_url,
        repo_id=repo_id if type(repo_id) is int and repo_id > 0 else 0,
    )


@dataclass(frozen=True, slots=True)
class CacheGrants:
    """What the claimer puts in each assignment when the cache is on."""

    url: str
    v2: bool
    key: bytes

    def options_for(self, task: Task, *, gitea_url: str, deadline: datetime) -> CacheServiceOptions:
        token = runtime_token(task)
        if not token:
            return CacheServiceOptions()  # a task without a token cannot authenticate to the cache
        grant = grant_for_task(
            task.context or {},
            runtime_token=token,
            task_id=task.id,
            expires=int(deadline.timestamp()),
            results_url=gitea_url,
        )
        return CacheServiceOptions(url=self.url, v2=self.v2, grant=sign(grant, self.key))
