"""An action's inputs: the step's `with:`, the defaults of its metadata, what it requires.

Names match ignoring case (as on GitHub). A declared input the step does not give takes its
`default` (which may hold an expression: `${{ github.token }}` is common). An input the
action declares `required` with no default and the step does not give fails the step with
a clear error — GitHub leaves that check to the action itself (`core.getInput(..., {required:
true})`), which a composite action cannot make; we make it for every kind. An input the
action does not declare is passed on with GitHub's warning. Node actions see each input as
`INPUT_<NAME>`: the name upper-cased with spaces made `_` (GitHub's and `@actions/core`'s
rule; `-` and `.` stay).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynrunner.executor.actions.manifest import Manifest


class InputError(ValueError):
    """Required inputs are missing; the message names them."""


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
        elif spec.required:
            missing.append(name)
        else:
            values[name] = ""
    if missing:
        names = ", ".join(f"'{name}'" for name in missing)
        raise InputError(
            f"Input required and not supplied: {names}. The action '{action}' requires "
            f"{'it' if len(missing) == 1 else 'them'}; give {'it' if len(missing) == 1 else 'them'} under `with:`."
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
