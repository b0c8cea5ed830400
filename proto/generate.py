"""Regenerate the Python stubs under src/dynrunner/proto/_gen from protos/.

One command (`make proto`), reproducible: protoc from grpcio-tools, `--python_out`,
`--pyi_out` and protoc-gen-connectrpc with `protobuf=google`; the SPIRE Server API under
protos/spire/ gets gRPC stubs (`--grpc_python_out`) instead. The .proto file names stay
as upstream has them (`runner/v1/messages.proto`, `spire/api/types/agent.proto`, ...), so
descriptors match Gitea's and SPIRE's; only the Python import paths are rewritten into our
package.

The SPIRE messages are registered in a descriptor pool of their own
(`dynrunner.proto._gen.spire.POOL`), not protobuf's default pool: another copy of
spire-api-sdk's files in the same process (the test doubles carry one) would otherwise
refuse to load ("duplicate file name"). The wire format does not depend on the pool.
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
SPIRE = "spire"
SPIRE_POOL = '''"""The descriptor pool of the SPIRE Server API messages (see proto/generate.py)."""

from google.protobuf import descriptor_pool, empty_pb2

POOL = descriptor_pool.DescriptorPool()
POOL.AddSerializedFile(empty_pb2.DESCRIPTOR.serialized_pb)
'''


def _rewrite_imports(text: str) -> str:
    for pkg in PROTO_PACKAGES:
        text = re.sub(rf"^from {re.escape(pkg)}(\.\w+)? import", rf"from {PACKAGE}.{pkg}\1 import", text, flags=re.M)
        text = re.sub(rf"^import {re.escape(pkg)}\.", f"import {PACKAGE}.{pkg}.", text, flags=re.M)
    text = re.sub(r"^from spire\.([\w.]+) import", rf"from {PACKAGE}.spire.\1 import", text, flags=re.M)
    return text


def _own_pool(text: str) -> str:
    """A SPIRE module registers its messages in `dynrunner.proto._gen.spire.POOL`."""
    text = text.replace(
        "from google.protobuf import descriptor_pool as _descriptor_pool\n",
        f"from {PACKAGE}.{SPIRE} import POOL as _POOL\n",
    )
    return text.replace("_descriptor_pool.Default()", "_POOL")


def _protoc(raw: str, sources: list[str], plugin_args: list[str]) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"--python_out={raw}",
            f"--pyi_out={raw}",
            *plugin_args,
            *sources,
        ],
        check=True,
    )


def generate(out: Path) -> None:
    """Generate into `out` (created fresh)."""
    plugin = Path(sys.executable).parent / "protoc-gen-connectrpc"
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    spire = [s for s in sources if s.startswith(f"{SPIRE}/")]
    connect = [s for s in sources if s not in spire]
    with tempfile.TemporaryDirectory() as raw:
        connect_opts = [
            f"--plugin=protoc-gen-connectrpc={plugin}",
            f"--connectrpc_out={raw}",
            "--connectrpc_opt=protobuf=google",
        ]
        _protoc(raw, connect, connect_opts)
        _protoc(raw, spire, [f"--grpc_python_out={raw}"])
        if out.exists():
            shutil.rmtree(out)
        for src in sorted(Path(raw).rglob("*.py*")):
            rel = src.relative_to(raw)
            text = src.read_text()
            if rel.parts[0] == SPIRE:
                if src.name.endswith("_pb2_grpc.py") and "\nclass " not in text:
                    continue  # a .proto without services
                text = _own_pool(text)
            dst = out / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(_rewrite_imports(text))
    for directory in [out, *sorted(p for p in out.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").write_text(SPIRE_POOL if directory == out / SPIRE else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=TARGET)
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()
