"""Regenerate the Python stubs under src/dynrunner/proto/_gen from protos/.

One command (`make proto`), reproducible: protoc from grpcio-tools, `--python_out`,
`--pyi_out` and protoc-gen-connectrpc with `protobuf=google`. The .proto file names stay
as upstream has them (`runner/v1/messages.proto`, ...), so descriptors match Gitea's;
only the Python import paths are rewritten into our package.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = HERE / "protos"
TARGET = HERE / "src" / "dynrunner" / "proto" / "_gen"
PACKAGE = "dynrunner.proto._gen"
PROTO_PACKAGES = ("runner.v1", "ping.v1", "dynrunner.assignment.v1")


def _rewrite_imports(text: str) -> str:
    for pkg in PROTO_PACKAGES:
        text = re.sub(rf"^from {re.escape(pkg)}(\.\w+)? import", rf"from {PACKAGE}.{pkg}\1 import", text, flags=re.M)
        text = re.sub(rf"^import {re.escape(pkg)}\.", f"import {PACKAGE}.{pkg}.", text, flags=re.M)
    return text


def generate(out: Path) -> None:
    """Generate into `out` (created fresh)."""
    plugin = Path(sys.executable).parent / "protoc-gen-connectrpc"
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as raw:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{PROTOS}",
                f"--python_out={raw}",
                f"--pyi_out={raw}",
                f"--plugin=protoc-gen-connectrpc={plugin}",
                f"--connectrpc_out={raw}",
                "--connectrpc_opt=protobuf=google",
                *sources,
            ],
            check=True,
        )
        if out.exists():
            shutil.rmtree(out)
        for src in sorted(Path(raw).rglob("*.py*")):
            dst = out / src.relative_to(raw)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(_rewrite_imports(src.read_text()))
    for directory in [out, *sorted(p for p in out.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").write_text("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=TARGET)
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()
