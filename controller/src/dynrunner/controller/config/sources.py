"""Where configuration values come from: the YAML file and `DYNRUNNER_*` environment variables.

Environment variable names are derived from the models, so every scalar key has one and the
scheme stays regular: the key path in upper case, camelCase split at capitals, joined by `_`
(`nats.ackWaitSeconds` → `DYNRUNNER_NATS_ACK_WAIT_SECONDS`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from dynrunner.controller.config.errors import ConfigError

ENV_PREFIX = "DYNRUNNER_"


def default_state_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "dynrunner"


def env_keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """Map each overridable environment variable to its key path (by YAML alias).

    Scalars of every section can be overridden; lists (pools, retired keys) only in YAML.
    """
    names: dict[str, tuple[str, ...]] = {}
    for field_name, info in model.model_fields.items():
        alias = info.alias or field_name
        path = (*prefix, alias)
        annotation = info.annotation
        optional = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
        if type(None) in getattr(annotation, "__args__", ()) and len(optional) == 1:
            annotation = optional[0]  # an optional section (`X | None`): its scalars all the same
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names.update(env_keys(annotation, path))
            continue
        if getattr(annotation, "__origin__", None) is list or field_name == "pools":
            continue
        env_name = ENV_PREFIX + "_".join(_upper_snake(p) for p in path)
        names[env_name] = path
    return names


def _upper_snake(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", camel).upper()


_EXCLUSIVE: dict[tuple[str, ...], tuple[str, ...]] = {
    ("gitea", "registrationToken"): ("gitea", "registrationTokenFile")
}
_EXCLUSIVE.update({v: k for k, v in _EXCLUSIVE.items()})


def apply_env(data: dict[str, Any], env: Mapping[str, str], model: type[BaseModel]) -> None:
    """Write each `DYNRUNNER_*` value found in `env` into `data` (the parsed YAML) at its key path."""
    for env_name, path in env_keys(model).items():
        if env_name not in env:
            continue
        node = data
        for key in path[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        node[path[-1]] = env[env_name]
        other = _EXCLUSIVE.get(path)
        if other is not None:
            node.pop(other[-1], None)


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(str(path), [f"cannot read the configuration file: {err.strerror or err}"]) from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), ["the configuration file is not UTF-8 text"]) from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(str(path), [f"{where}invalid YAML: {problem}"]) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(str(path), [f"the top level must be a mapping of keys, not {type(loaded).__name__}"])
    return loaded
