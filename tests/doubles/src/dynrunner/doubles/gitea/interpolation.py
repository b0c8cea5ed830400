"""The expression subset Gitea's jobparser needs at parse time (job names, `runs-on`,
`continue-on-error`, `run-name`): references into `matrix`, `github`, `vars` and `inputs`
(dotted or `['key']`, case-insensitive) and literals. Anything else is left as written; the
runner evaluates everything else later anyway.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dynrunner.doubles.gitea.yamlio import go_sprint, go_value

_EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)


class _Unsupported(Exception):
    pass


_PATH = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)((?:\.[A-Za-z_][A-Za-z0-9_-]*|\[\s*'[^']*'\s*\])*)$")
_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[\s*'([^']*)'\s*\]")


def _evaluate_expr(expr: str, scope: Mapping[str, Any]) -> Any:
    expr = expr.strip()
    if re.fullmatch(r"'(?:[^']|'')*'", expr):
        return expr[1:-1].replace("''", "'")
    if expr in ("true", "false"):
        return expr == "true"
    if expr == "null":
        return None
    if re.fullmatch(r"-?\d+(?:\.\d+)?", expr):
        return float(expr) if "." in expr else int(expr)
    match = _PATH.match(expr)
    if not match or match.group(1).lower() not in scope:
        raise _Unsupported(expr)
    value: Any = scope[match.group(1).lower()]
    for attr, key in _SEGMENT.findall(match.group(2)):
        name = attr or key
        if not isinstance(value, dict):
            return ""
        lowered = {str(k).lower(): v for k, v in value.items()}
        value = lowered.get(name.lower(), "")
    return value


def _to_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, int | float):
        return go_sprint(value)
    if isinstance(value, dict | list):
        return "Object" if isinstance(value, dict) else "Array"
    return str(value)


def interpolate(text: str, scope: Mapping[str, Any]) -> str:
    def replace(match: re.Match[str]) -> str:
        try:
            return _to_str(_evaluate_expr(match.group(1), scope))
        except _Unsupported:
            return match.group(0)

    return str(_EXPR.sub(replace, text))


def evaluate_node(value: Any, scope: Mapping[str, Any]) -> Any:
    """Evaluate expressions inside a raw node; a scalar that is one whole expression keeps
    the expression's type (so `runs-on: ${{ matrix.os }}` may yield a list)."""
    if isinstance(value, str):
        whole = _EXPR.fullmatch(value.strip())
        if whole:
            try:
                return go_value(_evaluate_expr(whole.group(1), scope))
            except _Unsupported:
                return value
        return interpolate(value, scope) if "${{" in value else value
    if isinstance(value, list):
        return [evaluate_node(v, scope) for v in value]
    if isinstance(value, dict):
        return {k: evaluate_node(v, scope) for k, v in value.items()}
    return value
