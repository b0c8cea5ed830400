"""`dynrunner-gitea-double serve`: the double as a process; `repo create|commit`: content for it.

`serve` prints one JSON line `{"url": ..., "registration_token": ..., "profile": ...}` on stdout once it
accepts connections, serves until SIGTERM or SIGINT, then exits with status 0.

`repo create --url URL OWNER/NAME [--private]` and `repo commit --url URL OWNER/NAME DIR
[--branch B] [--tag T]... [--message M]` talk to a running double's admin API; `commit` makes
the branch's tree exactly DIR's files (executable bits kept, `.git` skipped) and prints
`{"sha", "branch", "tags"}`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from dynrunner.doubles.gitea.double import GiteaDouble
from dynrunner.doubles.gitea.profiles import DEFAULT_PROFILE, PROFILES
from dynrunner.doubles.gitea.tokens import DEFAULT_PBKDF2_ITERATIONS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynrunner-gitea-double", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the Gitea double until SIGTERM/SIGINT")
    serve.add_argument("--state-dir", type=Path, required=True, help="directory for the SQLite file and logs")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--mode", choices=("gitea", "forgejo"), default="gitea", help="error shape on the wire")
    serve.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        default=DEFAULT_PROFILE,
        help=f"the Gitea release to answer as (default: {DEFAULT_PROFILE})",
    )
    serve.add_argument("--zombie-timeout", type=float, default=600.0, metavar="S", help="seconds (Gitea: 600)")
    serve.add_argument(
        "--pbkdf2-iterations",
        type=int,
        default=DEFAULT_PBKDF2_ITERATIONS,
        metavar="N",
        help="token hash cost (Gitea: 10000; lower it for load tests)",
    )
    serve.add_argument(
        "--legacy-empty-no-more", action="store_true", help="Gitea <= 1.26 UpdateLog behaviour (also on main)"
    )
    serve.add_argument("--default-actions-url", choices=("github", "self"), default="github")
    repo = sub.add_parser("repo", help="create repositories and commit to them in a running double")
    repo_sub = repo.add_subparsers(dest="repo_command", required=True)
    create = repo_sub.add_parser("create", help="create an empty repository")
    commit = repo_sub.add_parser("commit", help="commit a directory as the whole tree of a branch")
    for cmd in (create, commit):
        cmd.add_argument("--url", required=True, help="the double's URL")
        cmd.add_argument("repository", help="owner/name")
    create.add_argument("--private", action="store_true")
    create.add_argument("--default-branch", default="main")
    commit.add_argument("directory", type=Path)
    commit.add_argument("--branch", default=None, help="default: the repository's default branch")
    commit.add_argument("--tag", action="append", default=[], help="a tag to set on the commit (repeatable)")
    commit.add_argument("--message", default="commit from the command line")
    return parser


def _admin(url: str, path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{url.rstrip('/')}/_double/{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the double is local
    try:
        with opener.open(request, timeout=60) as response:
            result: dict[str, object] = json.loads(response.read())
            return result
    except urllib.error.HTTPError as err:
        raise SystemExit(f"dynrunner-gitea-double: {err.code}: {json.loads(err.read()).get('error')}") from None


def _tree(directory: Path) -> tuple[dict[str, str], list[str]]:
    """Every file below `directory` (base64), and the executable ones; `.git` is skipped."""
    files, executable = {}, []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if ".git" in relative.parts or not path.is_file() or path.is_symlink():
            continue
        files[relative.as_posix()] = base64.b64encode(path.read_bytes()).decode()
        if path.stat().st_mode & 0o111:
            executable.append(relative.as_posix())
    return files, executable


def _repo(args: argparse.Namespace) -> None:
    if args.repo_command == "create":
        body: dict[str, object] = {"repository": args.repository, "private": args.private}
        body["default_branch"] = args.default_branch
        print(json.dumps(_admin(args.url, "repos", body)))
        return
    if not args.directory.is_dir():
        raise SystemExit(f"dynrunner-gitea-double: {args.directory} is not a directory")
    files, executable = _tree(args.directory)
    body = {"files_base64": files, "executable": executable, "replace": True, "tags": args.tag}
    body["message"] = args.message
    if args.branch:
        body["branch"] = args.branch
    print(json.dumps(_admin(args.url, f"repos/{args.repository}/commits", body)))


async def _serve(args: argparse.Namespace) -> None:
    double = GiteaDouble(
        args.state_dir,
        mode=args.mode,
        zombie_timeout_s=args.zombie_timeout,
        pbkdf2_iterations=args.pbkdf2_iterations,
        legacy_empty_no_more=args.legacy_empty_no_more,
        default_actions_url=args.default_actions_url,
        profile=args.profile,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with double.serving(args.host, args.port):
            ready = {"url": double.url, "registration_token": double.registration_token, "profile": args.profile}
            print(json.dumps(ready), flush=True)
            await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        double.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        asyncio.run(_serve(args))
    elif args.command == "repo":
        _repo(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
