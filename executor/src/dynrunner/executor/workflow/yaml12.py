"""YAML as Gitea and GitHub read it: the YAML 1.2 core schema, not PyYAML's 1.1.

PyYAML resolves `on`, `yes`, `no` to booleans and `1:20` to 80; Gitea's Go YAML library
(and GitHub's parser) keep them as strings. A workflow value that silently changes type
would change what a step sees, so scalars are resolved here by the 1.2 rules. Each scalar
also keeps its source text, because `env:` and `with:` values are strings exactly as
written (`1.10` stays `1.10`, not `1.1`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_NULL = re.compile(r"^(?:~|null|Null|NULL)?$")
_BOOL_TRUE = re.compile(r"^(?:true|True|TRUE)$")
_BOOL_FALSE = re.compile(r"^(?:false|False|FALSE)$")
_INT10 = re.compile(r"^[-+]?[0-9]+$")
_INT8 = re.compile(r"^0o[0-7]+$")
_INT16 = re.compile(r"^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")
_NAN = re.compile(r"^\.(?:nan|NaN|NAN)$")
MAX_NODES = 250_000
"""Nodes a document may expand to. Gitea's payloads carry no aliases (its YAML library expands
them, and refuses excessive aliasing); this keeps an alias bomb from expanding forever here."""


class YamlError(ValueError):
    """The document is not YAML, or uses something a workflow may not (duplicate keys)."""


@dataclass(frozen=True, slots=True)
class Scalar:
    """A resolved scalar with the text it was written as."""

    value: Any
    text: str


def _plain(text: str) -> Any:
    if _NULL.match(text):
        return None
    if _BOOL_TRUE.match(text):
        return True
    if _BOOL_FALSE.match(text):
        return False
    if _INT10.match(text):
        return int(text)
    if _INT8.match(text):
        return int(text[2:], 8)
    if _INT16.match(text):
        return int(text[2:], 16)
    if _FLOAT.match(text):
        return float(text)
    if _INF.match(text):
        return -math.inf if text.startswith("-") else math.inf
    if _NAN.match(text):
        return math.nan
    return text


def _where(node: yaml.Node) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}"


class _Budget:
    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_NODES


def _convert(node: yaml.Node, keep_text: bool, budget: _Budget) -> Any:
    budget.left -= 1
    if budget.left < 0:
        raise YamlError(f"the document expands to more than {MAX_NODES} nodes (through aliases)")
    if isinstance(node, yaml.ScalarNode):
        value = _plain(node.value) if not node.style else node.value
        return Scalar(value, node.value) if keep_text else value
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, keep_text, budget) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        merged: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    part = _convert(source, keep_text, budget)
                    if not isinstance(part, dict):
                        raise YamlError(f"a merge key (<<) needs a mapping at {_where(source)}")
                    for k, v in part.items():
                        merged.setdefault(k, v)
                continue
            key = _convert(key_node, False, budget)
            if isinstance(key, (dict, list)):
                raise YamlError(f"a mapping key must be a scalar at {_where(key_node)}")
            key = "" if key is None else key if isinstance(key, str) else key_node.value
            if key in out:
                raise YamlError(f"key {key!r} is defined twice at {_where(key_node)}")
            out[key] = _convert(value_node, keep_text, budget)
        for k, v in merged.items():
            out.setdefault(k, v)
        return out
    raise YamlError(f"unsupported YAML node at {_where(node)}")


def load(text: str | bytes, *, keep_text: bool = False) -> Any:
    """Parse one YAML document. Mapping keys are always strings; with `keep_text`, scalars
    are `Scalar`s carrying their source text."""
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as err:
        raise YamlError(str(err)) from err
    if node is None:
        return None
    try:
        return _convert(node, keep_text, _Budget())
    except RecursionError:
        raise YamlError("the document nests too deeply (or an alias refers to itself)") from None


def plain(value: Any) -> Any:
    """Strip `Scalar` wrappers: the typed value tree."""
    if isinstance(value, Scalar):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def as_written(value: Any) -> Any:
    """Scalars as their source text (nulls as ''), containers recursively: how `env:` and
    `with:` values reach a step."""
    if isinstance(value, Scalar):
        return "" if value.value is None else value.text
    if isinstance(value, dict):
        return {k: as_written(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_written(v) for v in value]
    return value
