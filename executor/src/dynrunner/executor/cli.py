"""`dynrunner-executor`: one entry point, one subcommand per capability.

Each subcommand's module owns its arguments (`add_arguments`) and behaviour (`main`),
so the CLI stays a table. Only the module of the subcommand given is imported: `run`
starts a job and should not pay for the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS = {
    "run": ("dynrunner.executor.run", "run one assigned Gitea task and report it"),
    "expr": ("dynrunner.executor.expr_cli", "evaluate GitHub Actions expressions"),
    "artifact": ("dynrunner.executor.runtime.cli", "import and list job-to-job artifacts"),
    "stage-agent": (
        "dynrunner.executor.containers.stage",
        "copy the container agent and Node into a Pod's shared directory",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dynrunner-executor", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    words = sys.argv[1:] if argv is None else list(argv)
    chosen = next((word for word in words if not word.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module_name).add_arguments(subparser)
    args = parser.parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
