"""What a job-level `uses:` names, and what the called workflow accepts (`on.workflow_call`).

Forms (Gitea's, both served from the Gitea instance the task came from):

- `./.gitea/workflows/x.yml` (or `.github/workflows/`): a workflow of the caller's own
  repository, at the commit the run is for (`github.sha`);
- `owner/repo/.gitea/workflows/x.yml@ref`: a workflow of another repository on the instance.

A workflow lives directly in one of the two workflow directories, as GitHub and Gitea require.

The checks follow GitHub's (`workflow_call` in "Workflow syntax" and "Reusing workflows"):
every input declares `type: string | number | boolean`; a `with:` key the called workflow does
not declare is an error, so is a value of the wrong type (a boolean input takes a boolean, not
the string `'true'`; a number input takes a number; a string input takes any scalar, as its
text) and a `required` input without a value or a default. Secret names ignore case; a secret
the called workflow does not declare is an error, so is a missing `required` one.
`secrets: inherit` passes all of the caller's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

WORKFLOW_DIRS = (".gitea/workflows", ".github/workflows")
MAX_LEVELS = 10
"""Levels of workflows one run may connect: the top-level caller and up to nine levels of
reusable workflows (GitHub's documented limit on github.com; GitHub Enterprise Server keeps four)."""

_NAME = r"[A-Za-z0-9_.-]+"
_REMOTE_RE = re.compile(rf"^({_NAME})/({_NAME})/([^@]+)@(.+)$")
INPUT_TYPES = ("string", "number", "boolean")


class CallError(ValueError):
    """The call cannot be made as written; the message says why."""


@dataclass(frozen=True, slots=True)
class CallRef:
    owner: str
    repo: str
    path: str
    ref: str
    local: bool
    """Written as `./path`: the caller's repository at the run's commit."""

    @property
    def repository(self) -> str:
        return f"{self.owner}/{self.repo}"

    @property
    def key(self) -> str:
        """What identifies the workflow in a chain of calls (cycles)."""
        return f"{self.repository}/{self.path}@{self.ref}"

    def __str__(self) -> str:
        return f"./{self.path}" if self.local else f"{self.repository}/{self.path}@{self.ref}"


def _check_path(path: str, uses: str) -> str:
    directory, _, name = path.rpartition("/")
    if directory not in WORKFLOW_DIRS or not name.endswith((".yml", ".yaml")) or name.startswith("."):
        raise CallError(
            f"`uses: {uses}` names no reusable workflow: the file must be a .yml or .yaml file directly "
            f"in {' or '.join(WORKFLOW_DIRS)}"
        )
    return path


def parse_call(uses: str, *, repository: str, sha: str) -> CallRef:
    """The workflow a job's `uses:` calls; `repository` and `sha` are the run's (`./` form)."""
    uses = uses.strip()
    if uses.startswith("./"):
        if "@" in uses:
            raise CallError(
                f"`uses: {uses}`: a workflow of the same repository takes no @ref (it runs at the run's commit)"
            )
        owner, _, repo = repository.partition("/")
        if not owner or not repo or not sha:
            raise CallError(f"`uses: {uses}`: the task names no repository and commit to read it from")
        return CallRef(owner, repo, _check_path(uses[2:], uses), sha, local=True)
    if "://" in uses:
        raise CallError(
            f"`uses: {uses}`: reusable workflows are read from this Gitea instance only; "
            "write owner/repo/.gitea/workflows/<file>.yml@ref"
        )
    match = _REMOTE_RE.match(uses)
    if match is None:
        raise CallError(
            f"`uses: {uses}` names no reusable workflow: expected ./.gitea/workflows/<file>.yml or "
            "owner/repo/.gitea/workflows/<file>.yml@ref (.github/workflows also works)"
        )
    owner, repo, path, ref = match.groups()
    if owner in (".", "..") or repo in (".", "..") or ref.startswith("-"):
        raise CallError(f"`uses: {uses}` names no repository and ref")
    return CallRef(owner, repo, _check_path(path, uses), ref, local=False)


@dataclass(frozen=True, slots=True)
class InputSpec:
    type: str
    required: bool = False
    default: Any = None
    """As written; an expression is evaluated in the called workflow (`inputs.<id>.default`)."""


@dataclass(frozen=True, slots=True)
class CallSpec:
    """`on.workflow_call` of a called workflow."""

    inputs: Mapping[str, InputSpec] = field(default_factory=dict)
    secrets: Mapping[str, bool] = field(default_factory=dict)
    """Declared secret names (upper case) → required."""
    outputs: Mapping[str, Any] = field(default_factory=dict)
    """Output name → its `value:` expression."""


def _declared(on: Any) -> Mapping[str, Any] | None:
    """The `workflow_call` entry of `on:` ({} when declared without settings), None when absent."""
    if on == "workflow_call":
        return {}
    if isinstance(on, list):
        return {} if "workflow_call" in on else None
    if isinstance(on, Mapping) and "workflow_call" in on:
        value = on["workflow_call"]
        return value if isinstance(value, Mapping) else {}
    return None


def _section(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise CallError(f"on.workflow_call.{where} must be a mapping")
    return value


def call_spec(on: Any, name: str) -> CallSpec:
    """Read `on.workflow_call` (`on` as plain values); `name` says which workflow in errors."""
    declared = _declared(on)
    if declared is None:
        raise CallError(f"{name} cannot be called: its `on:` does not list `workflow_call`")
    inputs: dict[str, InputSpec] = {}
    for key, raw in _section(declared.get("inputs"), "inputs").items():
        spec = raw if isinstance(raw, Mapping) else {}
        kind = spec.get("type")
        if kind not in INPUT_TYPES:
            raise CallError(
                f"{name}: input '{key}' must declare `type:` string, number or boolean"
                + (f" (it has {kind!r})" if kind is not None else "")
            )
        inputs[str(key)] = InputSpec(str(kind), spec.get("required") is True, spec.get("default"))
    secrets = {
        str(key).upper(): isinstance(raw, Mapping) and raw.get("required") is True
        for key, raw in _section(declared.get("secrets"), "secrets").items()
    }
    outputs: dict[str, Any] = {}
    for key, raw in _section(declared.get("outputs"), "outputs").items():
        if not isinstance(raw, Mapping) or "value" not in raw:
            raise CallError(f"{name}: output '{key}' must have a `value:`")
        outputs[str(key)] = raw["value"]
    return CallSpec(inputs, secrets, outputs)


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() and not math.isinf(value) else value


def typed_input(name: str, kind: str, value: Any) -> Any:
    """`value` as an input of type `kind`, or CallError naming the input and what it got."""
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        raise CallError(f"input '{name}' is a boolean, but the caller passed {_shown(value)}")
    if kind == "number":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _number(float(value)) if isinstance(value, float) else value
        raise CallError(f"input '{name}' is a number, but the caller passed {_shown(value)}")
    if isinstance(value, (dict, list)):
        raise CallError(f"input '{name}' is a string, but the caller passed {_shown(value)}")
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, float):
        value = _number(value)
    return str(value)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if value is None:
        return "null"
    return "an object" if isinstance(value, dict) else "an array"


def resolve_inputs(
    spec: CallSpec, given: Mapping[str, Any], default: Callable[[str, Any], Any], name: str
) -> dict[str, Any]:
    """The called workflow's `inputs` context: each `with:` value (already evaluated in the
    caller) checked against its declared type, declared defaults (evaluated by `default`) for
    the others. Raises CallError for an undeclared input, a wrong type or a missing required one."""
    unknown = sorted(set(given) - set(spec.inputs))
    if unknown:
        raise CallError(f"{name} declares no input {', '.join(repr(k) for k in unknown)} (`with:` of the call)")
    out: dict[str, Any] = {}
    for key, input_spec in spec.inputs.items():
        if key in given:
            out[key] = typed_input(key, input_spec.type, given[key])
        elif input_spec.default is not None:
            out[key] = typed_input(key, input_spec.type, default(key, input_spec.default))
        elif input_spec.required:
            raise CallError(f"{name} requires the input '{key}', and the call passes none")
        else:
            out[key] = {"boolean": False, "number": 0}.get(input_spec.type, "")
    return out


def resolve_secrets(
    spec: CallSpec, raw: Any, caller: Mapping[str, str], evaluate: Callable[[str, Any], str], name: str
) -> dict[str, str]:
    """The called workflow's `secrets` context. `raw` is the call's `secrets:` (None,
    `inherit` or a mapping whose values `evaluate` turns into text in the caller's contexts).
    The task token stays available (`GITHUB_TOKEN`, `GITEA_TOKEN`) as on GitHub."""
    tokens = {k: v for k, v in caller.items() if k in ("GITHUB_TOKEN", "GITEA_TOKEN")}
    if raw == "inherit":
        return dict(caller)
    if raw is None:
        passed: dict[str, str] = {}
    elif isinstance(raw, Mapping):
        passed = {}
        for key, value in raw.items():
            upper = str(key).upper()
            if upper not in spec.secrets:
                raise CallError(f"{name} declares no secret '{key}' (`secrets:` of the call)")
            passed[upper] = evaluate(str(key), value)
    else:
        raise CallError("the call's `secrets:` must be a mapping or `inherit`")
    missing = sorted(key for key, required in spec.secrets.items() if required and key not in passed)
    if missing:
        raise CallError(f"{name} requires the secret {', '.join(repr(k) for k in missing)}, and the call passes none")
    return {**tokens, **passed}
