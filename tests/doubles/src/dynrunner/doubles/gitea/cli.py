"""`dynrunner-gitea-double serve`: the double as a process.

Prints one JSON line `{"url": ..., "registration_token": ...}` on stdout once it accepts
connections, serves until SIGTERM or SIGINT, then exits with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from dynrunner.doubles.gitea.double import GiteaDouble
from dynrunner.doubles.gitea.tokens import DEFAULT_PBKDF2_ITERATIONS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynrunner-gitea-double", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the Gitea double until SIGTERM/SIGINT")
    serve.add_argument("--state-dir", type=Path, required=True, help="directory for the SQLite file and logs")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--mode", choices=("gitea", "forgejo"), default="gitea", help="error shape on the wire")
    serve.add_argument("--zombie-timeout", type=float, default=600.0, metavar="S", help="seconds (Gitea: 600)")
    serve.add_argument(
        "--pbkdf2-iterations",
        type=int,
        default=DEFAULT_PBKDF2_ITERATIONS,
        metavar="N",
        help="token hash cost (Gitea: 10000; lower it for load tests)",
    )
    serve.add_argument("--legacy-empty-no-more", action="store_true", help="Gitea <= 1.26 UpdateLog behaviour")
    serve.add_argument("--default-actions-url", choices=("github", "self"), default="github")
    return parser


async def _serve(args: argparse.Namespace) -> None:
    double = GiteaDouble(
        args.state_dir,
        mode=args.mode,
        zombie_timeout_s=args.zombie_timeout,
        pbkdf2_iterations=args.pbkdf2_iterations,
        legacy_empty_no_more=args.legacy_empty_no_more,
        default_actions_url=args.default_actions_url,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with double.serving(args.host, args.port):
            print(json.dumps({"url": double.url, "registration_token": double.registration_token}), flush=True)
            await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        double.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
