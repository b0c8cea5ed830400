"""Regenerate the doubles' protobuf messages under src/dynrunner/doubles/spire/_gen from protos/.

One command (part of `make proto`), reproducible with protoc from grpcio-tools
(`--python_out`, `--pyi_out`). Only messages are generated: the Workload API double
registers its handlers by hand under the unpackaged service name, see protos/spire/workload.proto.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = HERE / "protos"
TARGET = HERE / "src" / "dynrunner" / "doubles" / "spire" / "_gen"


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
                *sources,
            ],
            check=True,
        )
        if out.exists():
            shutil.rmtree(out)
        for src in sorted(Path(raw).rglob("*.py*")):
            dst = out / src.relative_to(raw / Path("spire"))
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(src.read_text())
    (out / "__init__.py").write_text("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=TARGET)
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()
