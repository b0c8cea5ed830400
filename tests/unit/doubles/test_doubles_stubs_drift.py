"""The doubles' committed protobuf messages are exactly what tests/doubles/generate.py makes."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "tests" / "doubles" / "src" / "dynrunner" / "doubles" / "spire" / "_gen"


def _tree(base: Path) -> set[str]:
    return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_committed_messages_match_protos(tmp_path: Path):
    out = tmp_path / "_gen"
    subprocess.run([sys.executable, str(ROOT / "tests" / "doubles" / "generate.py"), "--out", str(out)], check=True)
    assert _tree(out) == _tree(COMMITTED), "generated file set differs: run `make proto`"
    differing = [rel for rel in sorted(_tree(out)) if not filecmp.cmp(out / rel, COMMITTED / rel, shallow=False)]
    assert not differing, f"messages drifted from .proto: {differing}; run `make proto`"
