"""`dynrunner-controller`: run the controller, check a configuration, or run the demo.

dynrunner-controller run --config FILE     claim, launch and reap until SIGTERM/SIGINT
dynrunner-controller check --config FILE   validate the config and reach Gitea and NATS
dynrunner-controller demo                  the whole flow on this machine, self-checking
dynrunner-controller cache-server --config FILE   serve the actions cache for controllers elsewhere
dynrunner-controller render --config FILE --pool NAME --task FILE
                                           the Kubernetes objects a task would get, touching no cluster
dynrunner-controller rbac --namespace NS   the RBAC objects the kubernetes backend needs
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from dynrunner.controller.config.model import ConfigError, ControllerConfig, load_config
from dynrunner.controller.infra.logs import configure_logging
from dynrunner.controller.infra.loops import Fatal
from dynrunner.proto.gitea import GiteaError
from dynrunner.proto.gitea.client import exit_without_finalization

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2


def entry() -> None:
    """The console script: after `run` or `check` the HTTP client's native thread may still be
    handing a response to the loop, so the process ends without interpreter finalization
    (see `exit_without_finalization`)."""
    exit_without_finalization(main())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dynrunner-controller", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the controller until SIGTERM or SIGINT")
    run.add_argument("--config", type=Path, help="YAML configuration (DYNRUNNER_* variables override it)")
    check = sub.add_parser("check", help="validate the configuration and check Gitea and NATS; non-zero on failure")
    check.add_argument("--config", type=Path, help="YAML configuration (DYNRUNNER_* variables override it)")
    demo = sub.add_parser("demo", help="run docs/examples/ against a bundled Gitea emulator; non-zero on any mismatch")
    demo.add_argument("--examples", type=Path, help="directory of example workflows (default: the bundled ones)")
    demo.add_argument("--keep", action="store_true", help="keep the demo's state directory")
    demo.add_argument("--verbose", action="store_true", help="show the controller's log")
    demo.add_argument(
        "--gitea",
        choices=("1.24", "1.25", "1.26", "main"),
        default="1.26",
        help="the Gitea release the emulator answers as (default: 1.26; docs/compatibility.md)",
    )
    cache = sub.add_parser("cache-server", help="serve the actions cache (the `cache` section) until SIGTERM/SIGINT")
    cache.add_argument("--config", type=Path, help="YAML with a `cache` section (DYNRUNNER_CACHE_* override it)")
    render = sub.add_parser("render", help="print the Secret, Pod and ClusterStaticEntry a task would get (no cluster)")
    render.add_argument("--config", type=Path, help="YAML configuration (DYNRUNNER_* variables override it)")
    render.add_argument("--pool", required=True, help="a pool with `backend.kind: kubernetes`")
    render.add_argument("--task", required=True, type=Path, help="a Gitea task as YAML or JSON (docs/kubernetes.md)")
    rbac = sub.add_parser("rbac", help="print the Role, ClusterRole and bindings the kubernetes backend needs")
    rbac.add_argument("--namespace", required=True, help="the namespace of the jobs' Pods")
    rbac.add_argument("--service-account", default="dynrunner-controller", help="the controller's service account")
    rbac.add_argument("--service-account-namespace", default="dynrunner", help="the controller's namespace")
    args = parser.parse_args(argv)
    if args.command == "rbac":
        from dynrunner.controller.backends.kubernetes.rbac import manifests

        print(manifests(args.namespace, args.service_account, args.service_account_namespace), end="")
        return EXIT_OK
    if args.command == "render":
        return _render(args.config, args.pool, args.task)

    if args.command == "cache-server":
        from dynrunner.controller.cache.serve import run_standalone

        return run_standalone(args.config)
    if args.command == "demo":
        from dynrunner.controller.demo import main as demo_main

        return demo_main(examples=args.examples, keep=args.keep, verbose=args.verbose, gitea=args.gitea)
    if args.command == "check":
        from dynrunner.controller.checks import run_checks

        return asyncio.run(run_checks(args.config))
    try:
        cfg = load_config(args.config)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    return _run(cfg)


def _render(config: Path | None, pool: str, task_file: Path) -> int:
    from dynrunner.controller.contract import ContractError
    from dynrunner.controller.render import RenderError, read_task, render

    try:
        cfg = load_config(config)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    try:
        print(render(cfg, pool, read_task(task_file)), end="")
    except (RenderError, ContractError) as err:
        print(f"dynrunner-controller render: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _run(cfg: ControllerConfig) -> int:
    configure_logging(cfg.logging.level, cfg.logging.json_format)
    try:
        asyncio.run(_serve(cfg))
    except (Exception, BaseExceptionGroup) as err:
        errors = _leaves(err)
        if not all(isinstance(e, Fatal | ConfigError | GiteaError | OSError | RuntimeError) for e in errors):
            raise
        for one in errors:
            prefix = "" if isinstance(one, Fatal) else "cannot start: "
            print(f"dynrunner-controller: {prefix}{one}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _leaves(err: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups, as the TaskGroup raises them."""
    if isinstance(err, BaseExceptionGroup):
        return [leaf for inner in err.exceptions for leaf in _leaves(inner)]
    return [err]


async def _serve(cfg: ControllerConfig) -> None:
    from dynrunner.controller.app import Controller

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await Controller(cfg).run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


if __name__ == "__main__":
    entry()
