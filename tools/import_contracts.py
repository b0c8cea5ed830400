"""Import-linter contract types of our own (registered in pyproject.toml `contract_types`)."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class AcyclicModulesContract(Contract):
    """No import cycle between modules under `packages` (TYPE_CHECKING imports count): a cycle
    makes the import order matter and hides which module owns a type. Unlike
    `acyclic_siblings`, a package may import another that imports it back, as long as no
    module is reached from itself."""

    type_name = "acyclic_modules"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        roots = [str(p) for p in self.packages]  # type: ignore[attr-defined]
        modules = sorted(m for m in graph.modules if any(m == r or m.startswith(r + ".") for r in roots))
        inside = set(modules)
        edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in inside) for m in modules}
        cycles = [c for c in _strongly_connected(modules, edges) if len(c) > 1]
        return ContractCheck(kept=not cycles, warnings=None, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"Import cycle among {len(cycle)} modules: {', '.join(sorted(cycle))}")
            output.new_line()


def _strongly_connected(nodes: list[str], edges: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the import graph is deep enough to hit recursion limits)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            successors = edges[node]
            if child < len(successors):
                work.append((node, child + 1))
                nxt = successors[child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


class TestsImportOnlySupportContract(Contract):
    """Test modules import shared helpers from the support package only, never another test
    module: a helper kept in a test file is run as a test wherever it is imported, and moving
    or deleting that test breaks strangers. Read from the files (`tests/` is no package of the
    import graph)."""

    type_name = "tests_import_only_support"

    tests_dir = fields.StringField()
    support = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        root = Path(str(self.tests_dir))
        allowed = tuple(str(s) for s in self.support)  # type: ignore[attr-defined]
        offences: list[str] = []
        for path in sorted(root.rglob("*.py")):
            if any(part in {"node_modules", "doubles", "__pycache__"} for part in path.parts):
                continue
            if path.relative_to(root).parts[0] in {p.split(".")[1] for p in allowed}:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] == root.name and not any(
                        name == s or name.startswith(s + ".") for s in allowed
                    ):
                        offences.append(f"{path}:{node.lineno} imports {name}")
        return ContractCheck(kept=not offences, warnings=None, metadata={"offences": offences})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for offence in check.metadata["offences"]:
            output.print_error(offence)
            output.new_line()
