"""`dynrunner-opensandbox-double serve`: the double as a process.

Prints one JSON line `{"url": ..., "api_key": ...}` on stdout once it accepts connections,
serves until SIGTERM or SIGINT (then kills every sandbox), and exits with status 0. Each
`--image URI` boots with this process's PATH; `--vm-image URI` boots vm/entrypoint.sh from
the given checkout at /usr/local/bin/dynrunner-vm-entrypoint, as tests/integration/vm does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from dynrunner.doubles.opensandbox.boot import LocalImage
from dynrunner.doubles.opensandbox.double import OpenSandboxDouble


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynrunner-opensandbox-double", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenSandbox double until SIGTERM/SIGINT")
    serve.add_argument("--state-dir", type=Path, required=True, help="directory for the sandboxes' rootfs and logs")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--runtime", choices=("docker", "kubernetes"), default="docker")
    serve.add_argument("--api-key", default=None, help="default: a random key (printed)")
    serve.add_argument("--image", action="append", default=[], metavar="URI", help="an image with the host's PATH")
    serve.add_argument("--vm-image", nargs=2, action="append", default=[], metavar=("URI", "CHECKOUT"))
    return parser


def _images(args: argparse.Namespace) -> dict[str, LocalImage]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    images = {uri: LocalImage(env=env) for uri in args.image}
    for uri, checkout in args.vm_image:
        vm = Path(checkout) / "vm"
        images[uri] = LocalImage(
            files={
                "/usr/local/bin/dynrunner-vm-entrypoint": vm / "entrypoint.sh",
                "/etc/dynrunner/spire-agent.conf.template": vm / "spire-agent.conf.template",
            },
            env={
                **env,
                "DYNRUNNER_SPIRE_AGENT_CONFIG_TEMPLATE": "{rootfs}/etc/dynrunner/spire-agent.conf.template",
            },
        )
    return images


async def _serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with OpenSandboxDouble.start(
        args.state_dir, host=args.host, port=args.port, runtime=args.runtime, api_key=args.api_key, images=_images(args)
    ) as double:
        print(json.dumps({"url": double.url, "api_key": double.api_key}), flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
