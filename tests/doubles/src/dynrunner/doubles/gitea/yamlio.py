"""YAML the way Gitea (Go yaml) reads and writes workflows.

Reading: YAML 1.2 booleans only (`on:` stays the string "on", not True as in YAML 1.1);
numbers remember their source text, because Gitea keeps raw nodes (`env`, `if`, `runs-on`,
...) as written and decodes some fields (`timeout-minutes`, step `with`) into strings,
which yields the text as written ("1.10", not 1.1).
Writing: block style, 2-space indent with indented sequences, literal blocks for
multi-line strings — the shape of Gitea's jobparser output
(`modules/actions/jobparser/testdata/*.out.yaml`). Like go-yaml's encoder, a string that
would read back as something else (a number, `true`, `null`) or as a YAML 1.1 boolean
(`on`, `yes`, `n`, ...) is double-quoted, so the `on:` key is written `"on":`. Go maps are
written in go-yaml's key order (`go_sorted`); struct fields and raw nodes keep theirs.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
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


class GoStr(str):
    """A string scalar of a raw node, with the style it was written in (None = plain):
    go-yaml writes raw nodes back in their own style, unlike Go strings it encodes."""

    style: str | None

    def __new__(cls, value: str, style: str | None) -> GoStr:
        obj = super().__new__(cls, value)
        obj.style = style
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


def _text(loader: _Loader, node: yaml.ScalarNode) -> GoStr:
    return GoStr(loader.construct_scalar(node), node.style)


_Loader.add_constructor("tag:yaml.org,2002:int", _int)
_Loader.add_constructor("tag:yaml.org,2002:float", _float)
_Loader.add_constructor("tag:yaml.org,2002:str", _text)


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
    """A value decoded into Go's `any` and encoded again: numbers lose their source text,
    maps come out in go-yaml's key order."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return go_sorted({k: go_value(v) for k, v in value.items()})
    if isinstance(value, list):
        return [go_value(v) for v in value]
    return value


def _key_less(a: str, b: str) -> bool:
    """go-yaml's `keyList.Less` for string keys: letters in code point order, runs of
    digits compared as numbers."""
    digits = False
    for i in range(min(len(a), len(b))):
        if a[i] == b[i]:
            digits = a[i].isdigit()
            continue
        al, bl = a[i].isalpha(), b[i].isalpha()
        if al and bl:
            return a[i] < b[i]
        if al or bl:
            return al if digits else bl
        an = bn = 0
        if a[i] == "0" or b[i] == "0":
            j = i - 1
            while j >= 0 and a[j].isdigit():
                if a[j] != "0":
                    an = bn = 1
                    break
                j -= 1
        ai = i
        while ai < len(a) and a[ai].isdigit():
            an = an * 10 + int(a[ai])
            ai += 1
        bi = i
        while bi < len(b) and b[bi].isdigit():
            bn = bn * 10 + int(b[bi])
            bi += 1
        if an != bn:
            return an < bn
        if ai != bi:
            return ai < bi
        return a[i] < b[i]
    return len(a) < len(b)


def _key_cmp(a: Any, b: Any) -> int:
    sa, sb = str(a), str(b)
    return -1 if _key_less(sa, sb) else (1 if _key_less(sb, sa) else 0)


def go_sorted(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    """A Go map as go-yaml writes it: keys in `keyList` order."""
    return {k: mapping[k] for k in sorted(mapping, key=functools.cmp_to_key(_key_cmp))}


class _Dumper(yaml.SafeDumper):
    yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


_STR = "tag:yaml.org,2002:str"
# go-yaml's isOldBool: YAML 1.1 booleans that a plain scalar must not look like
_OLD_BOOLS = frozenset(
    ["y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "n", "N", "no", "No", "NO", "off", "Off", "OFF"]
)


def _str(dumper: _Dumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar(_STR, value, style="|")
    if value in _OLD_BOOLS or dumper.resolve(yaml.ScalarNode, value, (True, False)) != _STR:
        return dumper.represent_scalar(_STR, value, style='"')
    return dumper.represent_scalar(_STR, value)


def _go_int(dumper: _Dumper, value: GoInt) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:int", value.source)


def _go_float(dumper: _Dumper, value: GoFloat) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:float", value.source)


def _float_plain(dumper: _Dumper, value: float) -> yaml.ScalarNode:
    if math.isfinite(value) and value.is_integer():
        return dumper.represent_scalar("tag:yaml.org,2002:int", go_sprint(value))
    return dumper.represent_scalar("tag:yaml.org,2002:float", repr(value))


def _go_str(dumper: _Dumper, value: GoStr) -> yaml.ScalarNode:
    if value.style is None:
        return dumper.represent_scalar(_STR, str(value))  # plain unless the emitter must quote it
    return dumper.represent_scalar(_STR, str(value), style=value.style)


_Dumper.add_representer(str, _str)
_Dumper.add_representer(GoStr, _go_str)
_Dumper.add_representer(GoInt, _go_int)
_Dumper.add_representer(GoFloat, _go_float)
_Dumper.add_representer(float, _float_plain)


def dump(value: Any) -> str:
    return yaml.dump(
        value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 30
    )
