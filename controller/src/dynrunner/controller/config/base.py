"""The base every configuration model shares (the controller's sections and each backend's
own model): camelCase YAML keys, `_s` ↔ `Seconds`, unknown keys refused, frozen values, and
paths relative to the configuration file. A module of its own so a backend's model can use
it without importing `config` (which imports the backends' models)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo
from pydantic.alias_generators import to_camel

from dynrunner.proto.assignment import IdentityWait


def config_alias(name: str) -> str:
    if name.endswith("_s"):
        name = name[:-2] + "_seconds"
    return to_camel(name)


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    """Relative paths in a config file are relative to that file's directory."""
    value = value.expanduser()
    base = (info.context or {}).get("base_dir")
    if not value.is_absolute() and base is not None:
        value = Path(base) / value
    return value


ConfigPath = Annotated[Path, AfterValidator(_resolve_path)]


class ConfigModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=config_alias,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        str_strip_whitespace=True,
    )


def check_executor_command(value: list[str]) -> list[str]:
    """A backend's `executorCommand`: the program and leading arguments."""
    if not value[0]:
        raise ValueError("the first element (the program) must not be empty")
    return value


class IdentityTimings(Protocol):
    """What a backend's configuration reads of `identity:` (the controller's IdentityConfig), so
    that the backends' models need not import the model that composes them."""

    @property
    def svid_timeout_s(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ExecutorNeeds:
    """What a pool's backend tells each executor about where it runs (into `ExecutorOptions`)."""

    workspace: str = ""
    """The workspace inside the environment ("": the backend sets it per environment, or the
    top-level `executor.workspace` applies)."""
    identity: IdentityWait = field(default_factory=IdentityWait)
    """Whether, where and how long the executor waits for its workload identity."""
