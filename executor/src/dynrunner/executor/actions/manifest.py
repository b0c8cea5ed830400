"""An action's metadata file (`action.yml`, else `action.yaml`) as typed values.

Kinds by `runs.using`: `composite` (steps), `node12`/`node16`/`node20`/`node24` (a
JavaScript file per stage: `pre`, `main`, `post`, with `pre-if`/`post-if`) and `docker`
(an image or a Dockerfile). A directory with a `Dockerfile` and no metadata file is a
Docker action, as on GitHub. Values that may hold expressions stay as written; they are
evaluated where the action runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynrunner.executor.workflow import Step, WorkflowError, parse_action_steps
from dynrunner.executor.workflow.yaml12 import YamlError, as_written, load, plain

METADATA_NAMES = ("action.yml", "action.yaml")
NODE_VERSIONS = ("node12", "node16", "node20", "node24")
MAX_METADATA_BYTES = 4 * 1024 * 1024


class ManifestError(ValueError):
    """The action's metadata cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Input:
    default: Any = None
    """As written (may hold `${{ }}`); None when the action gives no default."""
    required: bool = False
    deprecation: str = ""


@dataclass(frozen=True, slots=True)
class Manifest:
    name: str
    using: str
    """`composite`, `node12` … `node24`, or `docker`."""
    inputs: Mapping[str, Input] = field(default_factory=dict)
    outputs: Mapping[str, Any] = field(default_factory=dict)
    """Output name -> `value` as written (composite actions map their steps' outputs)."""
    main: str = ""
    pre: str = ""
    post: str = ""
    pre_if: str = ""
    post_if: str = ""
    steps: tuple[Step, ...] = ()
    image: str = ""
    entrypoint: str = ""
    """A docker action's `runs.entrypoint` (its image's own when empty)."""
    args: tuple[str, ...] = ()
    """A docker action's `runs.args`, as written (they may hold `${{ inputs.x }}`)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """A docker action's `runs.env`."""

    @property
    def kind(self) -> str:
        if self.using in NODE_VERSIONS:
            return "node"
        return self.using


def _text(value: Any, where: str) -> str:
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        raise ManifestError(f"{where} must be a string")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _flag(value: Any, where: str) -> bool:
    value = plain(value)
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise ManifestError(f"{where} must be true or false, not {value!r}")


def _inputs(raw: Any, within: str) -> dict[str, Input]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ManifestError(f"{within}inputs must be a mapping")
    inputs: dict[str, Input] = {}
    for name, raw_spec in raw.items():
        spec = raw_spec if isinstance(raw_spec, dict) else {}
        default = as_written(spec.get("default")) if "default" in spec else None
        if isinstance(default, (dict, list)):
            raise ManifestError(f"{within}inputs.{name}.default must be a string")
        inputs[str(name)] = Input(
            default=default,
            required=_flag(spec.get("required"), f"{within}inputs.{name}.required"),
            deprecation=_text(spec.get("deprecationMessage"), f"{within}inputs.{name}.deprecationMessage"),
        )
    return inputs


def _outputs(raw: Any, within: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ManifestError(f"{within}outputs must be a mapping")
    return {str(name): as_written(spec.get("value")) if isinstance(spec, dict) else None for name, spec in raw.items()}


def parse_manifest(data: bytes | str, within: str = "") -> Manifest:
    """`within` prefixes errors (e.g. "action ./x: ")."""
    try:
        doc = load(data, keep_text=True)
    except YamlError as err:
        raise ManifestError(f"{within}the metadata is not valid YAML: {err}") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{within}the metadata must be a YAML mapping")
    runs = doc.get("runs")
    if not isinstance(runs, dict):
        raise ManifestError(f"{within}the metadata has no `runs:` mapping")
    using = _text(runs.get("using"), f"{within}runs.using").strip().lower()
    fields: dict[str, Any] = {}
    if using == "composite":
        try:
            fields["steps"] = parse_action_steps(runs.get("steps"), within)
        except WorkflowError as err:
            raise ManifestError(str(err)) from None
    elif using in NODE_VERSIONS:
        fields["main"] = _text(runs.get("main"), f"{within}runs.main")
        if not fields["main"]:
            raise ManifestError(f"{within}runs.main is required for a {using} action")
        for key in ("pre", "post", "pre-if", "post-if"):
            fields[key.replace("-", "_")] = _text(runs.get(key), f"{within}runs.{key}")
    elif using == "docker":
        fields["image"] = _text(runs.get("image"), f"{within}runs.image")
        if not fields["image"]:
            raise ManifestError(f"{within}runs.image is required for a docker action")
        fields["entrypoint"] = _text(runs.get("entrypoint"), f"{within}runs.entrypoint")
        args = plain(runs.get("args")) or []
        if not isinstance(args, list):
            raise ManifestError(f"{within}runs.args must be a list")
        fields["args"] = tuple(_text(arg, f"{within}runs.args") for arg in args)
        env = plain(runs.get("env")) or {}
        if not isinstance(env, dict):
            raise ManifestError(f"{within}runs.env must be a mapping")
        fields["env"] = {str(k): _text(v, f"{within}runs.env.{k}") for k, v in env.items()}
    else:
        raise ManifestError(
            f"{within}runs.using is {using!r}; this runner runs composite, node12, node16, node20, node24 "
            "and docker actions"
        )
    return Manifest(
        name=_text(doc.get("name"), f"{within}name"),
        using=using,
        inputs=_inputs(doc.get("inputs"), within),
        outputs=_outputs(doc.get("outputs"), within),
        **fields,
    )


def read_manifest(directory: Path, within: str = "") -> Manifest:
    """The action in `directory`: its metadata file, or a lone Dockerfile (a Docker action)."""
    for name in METADATA_NAMES:
        path = directory / name
        if path.is_file():
            if path.stat().st_size > MAX_METADATA_BYTES:
                raise ManifestError(f"{within}{name} is larger than {MAX_METADATA_BYTES} bytes")
            return parse_manifest(path.read_bytes(), within)
    if (directory / "Dockerfile").is_file():
        return Manifest(name="", using="docker", image="Dockerfile")
    raise ManifestError(
        f"{within}found no action.yml, action.yaml or Dockerfile in {directory}"
        + ("" if directory.is_dir() else " (the directory does not exist)")
    )
