"""Label and field selectors as kube-apiserver parses and applies them.

Label selectors follow k8s.io/apimachinery/pkg/labels/selector.go: requirements joined by
commas (commas inside `( )` belong to a set), operators `=`, `==`, `!=`, `in`, `notin`,
`exists` (bare key), `!key`, and `gt`/`lt` on integers. Field selectors follow
k8s.io/apimachinery/pkg/fields/selector.go (`=`, `==`, `!=`, backslash escapes) with
each resource's supported field labels (its registry's `GetAttrs`/`SelectableFields`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dynrunner.doubles.kubernetes.resources import Resource
from dynrunner.doubles.kubernetes.status import ApiError, bad_request

_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present:
            return False
        try:
            number = int(value or "")
        except ValueError:
            return False
        return number > int(self.values[0]) if self.op == "gt" else number < int(self.values[0])


LabelSelector = tuple[Requirement, ...]


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _check_key(key: str) -> None:
    if not _KEY.match(key):
        raise bad_request(
            f'unable to parse requirement: values[0][{key}]: Invalid value: "{key}": name part must consist of '
            "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )


def _check_value(key: str, value: str) -> None:
    if len(value) > 63 or not _VALUE.match(value):
        raise bad_request(
            f'unable to parse requirement: values[0][{key}]: Invalid value: "{value}": a valid label must be an empty '
            "string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character"
        )


_SET = re.compile(r"^\s*(\S+?)\s+(in|notin)\s*\((.*)\)\s*$")
_CMP = re.compile(r"^\s*([^=!<>\s]+)\s*(==|=|!=|>|<)\s*(.*?)\s*$")


def parse_labels(text: str | None) -> LabelSelector:
    if not text or not text.strip():
        return ()
    out = []
    for raw in _split_top_level(text):
        part = raw.strip()
        if not part:
            raise bad_request(f"unable to parse requirement: found '', expected: identifier in {text!r}")
        if match := _SET.match(part):
            key, op, inner = match.group(1), match.group(2), match.group(3)
            values = tuple(v.strip() for v in inner.split(",")) if inner.strip() else ()
            _check_key(key)
            for value in values:
                _check_value(key, value)
            if not values:
                raise bad_request(
                    f"unable to parse requirement: for '{op}', 'notin' operators, values set can't be empty"
                )
            out.append(Requirement(key, op, values))
        elif match := _CMP.match(part):
            key, op, value = match.groups()
            _check_key(key)
            if op in (">", "<"):
                if not re.fullmatch(r"-?\d+", value):
                    raise bad_request(
                        "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer"
                    )
                out.append(Requirement(key, "gt" if op == ">" else "lt", (value,)))
                continue
            _check_value(key, value)
            out.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
        elif part.startswith("!"):
            _check_key(part[1:].strip())
            out.append(Requirement(part[1:].strip(), "!"))
        else:
            _check_key(part)
            out.append(Requirement(part, "exists"))
    return tuple(out)


def labels_match(selector: LabelSelector, obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(req.matches(labels) for req in selector)


FieldSelector = tuple[tuple[str, str, str], ...]  # (field, op, value) with op "=" or "!="


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def parse_fields(text: str | None, resource: Resource) -> FieldSelector:
    if not text or not text.strip():
        return ()
    out = []
    for part in re.split(r"(?<!\\),", text):
        match = re.match(r"^(.*?)(==|!=|=)(.*)$", part)
        if not match:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        fld, op, value = match.group(1).strip(), match.group(2), _unescape(match.group(3))
        supported = ("metadata.name", "metadata.namespace", *resource.field_labels)
        if fld not in supported:
            if resource.custom:
                raise bad_request(f'"{fld}" is not a known field selector: only "metadata.name", "metadata.namespace"')
            raise bad_request(f"field label not supported: {fld}")
        out.append((fld, "!=" if op == "!=" else "=", value))
    return tuple(out)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    if path == "source":
        path = "source.component"
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def fields_match(selector: FieldSelector, obj: Mapping[str, Any]) -> bool:
    for fld, op, value in selector:
        actual = field_value(obj, fld)
        if (actual == value) != (op == "="):
            return False
    return True


def matcher(labels: LabelSelector, fields: FieldSelector) -> Callable[[Mapping[str, Any]], bool]:
    return lambda obj: labels_match(labels, obj) and fields_match(fields, obj)


__all__ = ["ApiError", "matcher", "parse_fields", "parse_labels"]
