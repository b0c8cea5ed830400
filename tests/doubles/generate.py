"""Regenerate the doubles' protobuf messages under src/dynrunner/doubles/spire/_gen from protos/.

One command (part of `make proto`), reproducible with protoc from grpcio-tools
(`--python_out`, `--pyi_out`, and `--grpc_python_out` for the SPIRE Server API under
protos/spire/api/). The Workload API double registers its handlers by hand under the
unpackaged service name, see protos/spire/workload.proto. Imports between the generated
modules are rewritten into this package (`spire.api.types` → `dynrunner.doubles.spire._gen.api.types`).
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
TARGET = HERE / "src" / "dynrunner" / "doubles" / "spire" / "_gen"
PACKAGE = "dynrunner.doubles.spire._gen"


def _rewrite_imports(text: str) -> str:
    return re.sub(r"^from spire\.([\w.]+) import", rf"from {PACKAGE}.\1 import", text, flags=re.M)


def generate(out: Path) -> None:
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
                f"--grpc_python_out={raw}",
                *sources,
            ],
            check=True,
        )
        if out.exists():
            shutil.rmtree(out)
        for src in sorted(Path(raw).rglob("*.py*")):
            if src.name.endswith("_pb2_grpc.py") and "\nclass " not in src.read_text():
                continue  # a .proto without services
            dst = out / src.relative_to(raw / Path("spire"))
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
