"""Git's smart HTTP protocol on Gitea's routes, served by the real `git upload-pack`.

Routes (`routers/web/githttp.go`): `/{owner}/{repo}/info/refs`, `/{owner}/{repo}/git-upload-pack`
(also `git-receive-pack`, `git-upload-archive`), the repository name with or without `.git`.
Access (`routers/web/repo/githttp.go` `httpBase`, v1.26.1; `models/perm/access/repo_permission.go`
`GetActionsUserRepoPermission`):

* a public repository is read anonymously; anything else asks for credentials with
  401 and `WWW-Authenticate: Basic realm="Gitea"`;
* credentials that name nobody: 401 `Failed to authenticate user`, even for a public repository;
* a running task's token reads its own repository and public ones; another private
  repository (or one that does not exist) is 404 `Repository not found`.

The double serves fetches only: a push, once authorized, is refused with 403.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gzip
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from dynrunner.doubles.gitea import repos
from dynrunner.doubles.gitea.gitrepos import git_env
from dynrunner.doubles.gitea.httpio import Receive, Scope, Send, headers_of, plain, query_of, read_body, respond
from dynrunner.doubles.gitea.webauth import AuthFailed, web_doer

if TYPE_CHECKING:
    from dynrunner.doubles.gitea.engine import Engine

ROUTE = re.compile(r"^/([^/]+)/([^/]+)/(info/refs|git-upload-pack|git-receive-pack|git-upload-archive)$")
_SERVICES = ("upload-pack", "receive-pack", "upload-archive")
_SAFE_GIT_PROTOCOL = re.compile(r"^[0-9a-zA-Z]+=[0-9a-zA-Z]+(:[0-9a-zA-Z]+=[0-9a-zA-Z]+)*$")
_NO_CACHE = [
    (b"expires", b"Fri, 01 Jan 1980 00:00:00 GMT"),
    (b"pragma", b"no-cache"),
    (b"cache-control", b"no-cache, max-age=0, must-revalidate"),
]
_CHUNK = 64 * 1024


class _Refused(Exception):
    def __init__(self, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(text)
        self.status, self.text, self.headers = status, text, headers or []


def pkt_line(text: str) -> bytes:
    return f"{len(text) + 4:04x}{text}".encode()


class GitHTTP:
    def __init__(self, engine: Engine, pool: concurrent.futures.Executor) -> None:
        self.engine = engine
        self.pool = pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = ROUTE.match(scope["path"])
        assert match is not None, "routed here only for git paths"
        owner, name, action = match.group(1), match.group(2).removesuffix(".git"), match.group(3)
        method = scope["method"]
        headers = headers_of(scope)
        if action == "info/refs":
            if method != "GET":
                await plain(send, 405, "Method Not Allowed\n")
                return
            service = query_of(scope).get("service", "")
        else:
            if method != "POST":
                await plain(send, 405, "Method Not Allowed\n")
                return
            service = action
        try:
            if service and service.removeprefix("git-") not in _SERVICES:
                raise _Refused(400, "")
            kind = service.removeprefix("git-")
            path = await asyncio.get_running_loop().run_in_executor(
                self.pool, self._authorize, owner, name, kind, headers.get("authorization", "")
            )
            if action == "info/refs":
                await self._advertise(send, path, kind, headers)
            else:
                await self._rpc(send, receive, path, kind, headers)
        except _Refused as refused:
            await plain(send, refused.status, refused.text, refused.headers)

    def _authorize(self, owner: str, name: str, kind: str, authorization: str) -> str:
        """`httpBase`: the repository's directory when the request may go on."""
        engine = self.engine
        is_pull = kind in ("upload-pack", "upload-archive") or kind == ""
        with engine.store.read() as conn:
            if not repos.owner_exists(conn, owner):
                raise _Refused(404, "Not found.\n")
            try:
                doer = web_doer(
                    conn,
                    authorization,
                    iterations=engine.options.pbkdf2_iterations,
                    secret=engine.instance.signing_secret,
                    now=engine.clock.now(),
                )
            except AuthFailed as failed:
                raise _Refused(401, f"{failed}\n") from None
            repo = repos.find(conn, owner, name)
        public_pull = repo is not None and not repo["is_private"] and is_pull
        if not public_pull:
            if doer is None:
                raise _Refused(401, "Unauthorized\n", [(b"www-authenticate", b'Basic realm="Gitea"')])
            if repo is not None and not (doer.repo_id == repo["id"] or not repo["is_private"]):
                raise _Refused(404, "Repository not found")
        if repo is None:
            raise _Refused(404, "Repository not found")
        if not is_pull:
            raise _Refused(403, "The Gitea double serves fetches only; pushing is not supported")
        path = engine.repos.git.ensure(repo["owner_name"], repo["name"], repo["default_branch"])
        return str(path)

    async def _advertise(self, send: Send, path: str, kind: str, headers: dict[str, str]) -> None:
        if kind == "":
            await _run_git(path, ["update-server-info"], b"", {})
            body = await asyncio.to_thread(Path(path, "info", "refs").read_bytes)
            await respond(send, 200, "text/plain; charset=utf-8", body, _NO_CACHE)
            return
        if kind == "upload-archive":
            raise _Refused(400, "")
        refs = await _run_git(path, [kind, "--stateless-rpc", "--advertise-refs", "."], b"", _protocol(headers))
        body = pkt_line(f"# service=git-{kind}\n") + b"0000" + refs
        await respond(send, 200, f"application/x-git-{kind}-advertisement", body, _NO_CACHE)

    async def _rpc(self, send: Send, receive: Receive, path: str, kind: str, headers: dict[str, str]) -> None:
        if headers.get("content-type") != f"application/x-git-{kind}-request":
            raise _Refused(400, "")
        body = await read_body(receive)
        if headers.get("content-encoding") == "gzip":
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError, zlib.error):
                raise _Refused(400, "") from None
        args = [kind, "--stateless-rpc", "."] if kind != "upload-archive" else [kind, "."]
        process = await asyncio.create_subprocess_exec(
            "git",
            *args,
            cwd=path,
            env=git_env(_protocol(headers) | {"SSH_ORIGINAL_COMMAND": kind}),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert process.stdin is not None and process.stdout is not None

        async def feed() -> None:
            assert process.stdin is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.write(body)
                await process.stdin.drain()
            process.stdin.close()

        feeder = asyncio.create_task(feed(), name="git-rpc-stdin")
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", f"application/x-git-{kind}-result".encode())],
                }
            )
            while chunk := await process.stdout.read(_CHUNK):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await feeder
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            await process.wait()


def _protocol(headers: dict[str, str]) -> dict[str, str]:
    protocol = headers.get("git-protocol", "")
    return {"GIT_PROTOCOL": protocol} if protocol and _SAFE_GIT_PROTOCOL.match(protocol) else {}


async def _run_git(path: str, args: list[str], stdin: bytes, env: dict[str, str]) -> bytes:
    process = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=path,
        env=git_env(env),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate(stdin)
    if process.returncode != 0:
        raise _Refused(500, f"git {args[0]}: {err.decode(errors='replace').strip()}\n")
    return out
