"""YAML the way Gitea (Go yaml) reads and writes workflows.

Reading: YAML 1.2 booleans only (`on:` stays the string "on", not True as in YAML 1.1);
numbers remember their source text, because Gitea keeps raw nodes (`env`, `if`, `runs-on`,
...) as written and decodes some fields (`timeout-minutes`, step `with`) into strings,
which yields the text as written ("1.10", not 1.1).
Writing: block style, 2-space indent with indented sequences, literal blocks for
multi-line strings, keys in insertion order — the shape of Gitea's jobparser output
(`modules/actions/jobparser/testdata/*.out.yaml`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml


class GoInt(int):
    source: str

    def __new__(cls, value: int, source: str) -> GoInt:
        obj = super().__new__(cls, value)
        obj.source = source
        return obj


class GoFloat(float):
    source: str

    def __new__(cls, value: float, source: str) -> GoFloat:
        obj = super().__new__(cls, value)
        obj.source = source
        return obj


class _Loader(yaml.SafeLoader):
    pass


_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_Loader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.copy().items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))


def _int(loader: _Loader, node: yaml.ScalarNode) -> GoInt:
    return GoInt(yaml.SafeLoader.construct_yaml_int(loader, node), node.value)


def _float(loader: _Loader, node: yaml.ScalarNode) -> GoFloat:
    return GoFloat(yaml.SafeLoader.construct_yaml_float(loader, node), node.value)


_Loader.add_constructor("tag:yaml.org,2002:int", _int)
_Loader.add_constructor("tag:yaml.org,2002:float", _float)


def load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def go_string(value: Any) -> str:
    """A YAML value decoded into a Go `string` field."""
    if value is None:
        return ""
    if isinstance(value, GoInt | GoFloat):
        return value.source
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def go_sprint(value: Any) -> str:
    """`fmt.Sprint` of a decoded YAML value (matrix names)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e21:
            return str(int(value))
        return repr(float(value))
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, dict):
        inner = " ".join(f"{go_sprint(k)}:{go_sprint(v)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0])))
        return f"map[{inner}]"
    if isinstance(value, list):
        return "[" + " ".join(go_sprint(v) for v in value) + "]"
    return str(value)


def go_value(value: Any) -> Any:
    """Matrix values are re-encoded from Go values: numbers lose their source text."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {k: go_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [go_value(v) for v in value]
    return value


class _Dumper(yaml.SafeDumper):
    yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _str(dumper: _Dumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


def _go_int(dumper: _Dumper, value: GoInt) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:int", value.source)


def _go_float(dumper: _Dumper, value: GoFloat) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:float", value.source)


def _float_plain(dumper: _Dumper, value: float) -> yaml.ScalarNode:
    if math.isfinite(value) and value.is_integer():
        return dumper.represent_scalar("tag:yaml.org,2002:int", go_sprint(value))
    return dumper.represent_scalar("tag:yaml.org,2002:float", repr(value))


_Dumper.add_representer(str, _str)
_Dumper.add_representer(GoInt, _go_int)
_Dumper.add_representer(GoFloat, _go_float)
_Dumper.add_representer(float, _float_plain)


def dump(value: Any) -> str:
    return yaml.dump(
        value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 30
    )
