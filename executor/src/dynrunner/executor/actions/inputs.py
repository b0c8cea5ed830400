"""An action's inputs: the step's `with:`, the defaults of its metadata, what it requires.

Names match ignoring case (as on GitHub). A declared input the step does not give takes its
`default` (which may hold an expression: `${{ github.token }}` is common). An input the
action declares `required` with no default and the step does not give is empty, with a
warning: GitHub's runner does not check it (actions/runner#1070) and leaves that to the action
(`core.getInput(..., {required: true})`), and actions that declare an input required and
handle its absence themselves must run here as they run there. An input the
action does not declare is passed on with GitHub's warning. Node actions see each input as
`INPUT_<NAME>`: the name upper-cased with spaces made `_` (GitHub's and `@actions/core`'s
rule; `-` and `.` stay).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynrunner.executor.actions.manifest import Manifest


@dataclass(frozen=True, slots=True)
class Inputs:
    values: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def env_name(name: str) -> str:
    return "INPUT_" + name.replace(" ", "_").upper()


def resolve_inputs(
    manifest: Manifest, given: Mapping[str, str], default: Callable[[Any], str], *, action: str
) -> Inputs:
    """`default(value)` evaluates a declared default (raises ExpressionError)."""
    by_lower = {name.lower(): name for name in given}
    values: dict[str, str] = {}
    warnings: list[str] = []
    missing: list[str] = []
    for name, spec in manifest.inputs.items():
        supplied = by_lower.pop(name.lower(), None)
        if supplied is not None:
            values[name] = given[supplied]
            if spec.deprecation:
                warnings.append(f"Input '{name}' has been deprecated with message: {spec.deprecation}")
        elif spec.default is not None:
            values[name] = default(spec.default)
        else:
            values[name] = ""
            if spec.required:
                missing.append(name)
    if missing:
        names = ", ".join(f"'{name}'" for name in missing)
        it = "it" if len(missing) == 1 else "them"
        warnings.append(
            f"Input required and not supplied: {names}. The action '{action}' declares {it} required and "
            f"runs with {it} empty, as on GitHub; give {it} under `with:` if the action needs {it}."
        )
    if by_lower:
        extra = ", ".join(f"'{name}'" for name in by_lower.values())
        valid = ", ".join(f"'{name}'" for name in manifest.inputs)
        warnings.append(f"Unexpected input(s) {extra}, valid inputs are [{valid}]")
        for name in by_lower.values():
            values[name] = given[name]
    return Inputs(values, warnings)


def input_env(inputs: Mapping[str, str]) -> dict[str, str]:
    return {env_name(name): value for name, value in inputs.items()}
