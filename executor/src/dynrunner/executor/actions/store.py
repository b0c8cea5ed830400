"""Where a remote action's files come from: a read-only cache an image carries, or git.

1. The **seeded actions cache** (`DYNRUNNER_ACTIONS_CACHE`, optional, read-only): an image
   for air-gapped clusters can carry the actions its users need, one directory per
   repository and ref: `<cache>/<host>[:<port>]/<owner>/<repo>/<ref>/` (for example
   `git clone --depth 1 --branch v4 https://github.com/actions/checkout
   <cache>/github.com/actions/checkout/v4`; a ref with `/` is nested directories). An
   action found there is used in place, nothing is fetched.
2. Otherwise **git** fetches the ref alone, shallowly (`git fetch --depth=1 <url> <ref>`: a
   tag, a branch or a full commit SHA; for a SHA the server does not hand out on its own,
   the repository's branches and tags are fetched and the commit checked out), into the job's
   `.dynrunner/actions/`. Each repository and ref is fetched once per job; later steps (and
   composite actions using it again) reuse it.

The task token goes with the fetch only to the Gitea instance (`reference.token_allowed`),
the way `actions/checkout` sends it: an `AUTHORIZATION: basic base64(x-access-token:TOKEN)`
header, scoped in git's configuration to that URL, passed through the environment (never on
a command line) and with redirects off, so no other host ever receives it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dynrunner.executor.actions.reference import RemoteAction, token_allowed

SEEDED_CACHE_ENV = "DYNRUNNER_ACTIONS_CACHE"
FETCH_TIMEOUT_S = 600.0
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_SHORT_SHA = re.compile(r"^[0-9a-f]{4,39}$")

Log = Callable[[str], None]


class FetchError(RuntimeError):
    """The action could not be fetched; the message says why."""


@dataclass(frozen=True, slots=True)
class Fetched:
    directory: Path
    """The repository's files at the ref."""
    sha: str
    seeded: bool = False


def _seeded_path(cache: Path, action: RemoteAction) -> Path | None:
    host = action.base_url.split("://", 1)[-1].split("/", 1)[0]
    parts = [host, action.owner, action.repo, *action.ref.split("/")]
    if any(part in ("", ".", "..") or "\\" in part for part in parts):
        return None
    path = cache.joinpath(*parts)
    return path if path.is_dir() else None


class ActionStore:
    def __init__(
        self,
        root: Path,
        *,
        token: str,
        gitea_urls: tuple[str, ...],
        seeded: Path | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.token = token
        self.gitea_urls = gitea_urls
        self.seeded = seeded
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._fetched: dict[tuple[str, str], Fetched] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def get(self, action: RemoteAction, log: Log) -> Fetched:
        key = (action.clone_url, action.ref)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            found = self._fetched.get(key)
            if found is not None:
                return found
            seeded = _seeded_path(self.seeded, action) if self.seeded is not None else None
            if seeded is not None:
                found = Fetched(seeded, "", seeded=True)
                log(f"Using action repository '{action}' from the actions cache ({seeded})")
            else:
                found = await self._fetch(action)
                log(f"Download action repository '{action}' (SHA:{found.sha})")
            self._fetched[key] = found
            return found

    def _env(self, url: str) -> dict[str, str]:
        env = {k: v for k, v in self.base_env.items() if not k.startswith(("GIT_", "DYNRUNNER_"))}
        env.update(GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="true", SSH_ASKPASS="true")
        config: list[tuple[str, str]] = [("advice.detachedHead", "false"), ("init.defaultBranch", "main")]
        if self.token and token_allowed(url, self.gitea_urls):
            basic = base64.b64encode(f"x-access-token:{self.token}".encode()).decode()
            config += [(f"http.{url}.extraheader", f"AUTHORIZATION: basic {basic}"), ("http.followRedirects", "false")]
        env["GIT_CONFIG_COUNT"] = str(len(config))
        for i, (key, value) in enumerate(config):
            env[f"GIT_CONFIG_KEY_{i}"] = key
            env[f"GIT_CONFIG_VALUE_{i}"] = value
        return env

    async def _fetch(self, action: RemoteAction) -> Fetched:
        url = action.clone_url
        name = hashlib.sha256(f"{url}@{action.ref}".encode()).hexdigest()[:24]
        final = self.root / name
        work = self.root / f".{name}.partial"
        await asyncio.to_thread(_fresh_dir, work)
        env = self._env(url)
        try:
            await _git(["init", "-q", "."], work, env)
            fetched = await _git(["fetch", "-q", "--depth=1", "--no-tags", url, action.ref], work, env, check=False)
            if fetched[0] != 0 and _FULL_SHA.match(action.ref):
                refspecs = ["+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"]
                fetched = await _git(["fetch", "-q", url, *refspecs], work, env, check=False)
                target = action.ref
            else:
                target = "FETCH_HEAD"
            if fetched[0] != 0:
                raise FetchError(_fetch_failure(action, fetched[1]))
            await _git(["checkout", "-q", "--detach", target], work, env)
            sha = (await _git(["rev-parse", "HEAD"], work, env))[1].strip()
            await asyncio.to_thread(_replace_dir, work, final)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, work, True)
            raise
        return Fetched(final, sha)


def _fetch_failure(action: RemoteAction, stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    detail = "; ".join(lines[-3:]) or "git failed"
    message = f"Failed to fetch the action '{action}' from {action.clone_url}: {detail}"
    if _SHORT_SHA.match(action.ref) and not _FULL_SHA.match(action.ref):
        message += (
            f". If `{action.ref}` is a shortened commit SHA: those are not supported, use the full 40-character SHA"
        )
    return message


def _fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _replace_dir(work: Path, final: Path) -> None:
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)


async def _git(args: list[str], cwd: Path, env: Mapping[str, str], *, check: bool = True) -> tuple[int, str]:
    """Run git; (exit status, stdout) — or (status, stderr) when it failed and `check` is
    false. The process is killed when the caller is cancelled."""
    process = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), FETCH_TIMEOUT_S)
    except TimeoutError:
        raise FetchError(f"git {args[0]} did not finish within {FETCH_TIMEOUT_S:g} seconds") from None
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await asyncio.shield(process.wait())
    code = process.returncode or 0
    if code != 0:
        if check:
            raise FetchError(f"git {args[0]} failed: {err.decode(errors='replace').strip()}")
        return code, err.decode(errors="replace")
    return 0, out.decode(errors="replace")
