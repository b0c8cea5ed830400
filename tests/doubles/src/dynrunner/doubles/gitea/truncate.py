"""Gitea's `util.EllipsisDisplayString`, which cuts runner, job, step and run names.

Strings of at most `limit` UTF-8 bytes stay as they are. Longer ones keep as many
characters as fit into `limit - 3` "display columns" (CJK and emoji count two, the rest
one) followed by "…" ("..." once U+FFFD was seen), unless at most three characters
would be cut and they fit whole. Source: `modules/util/truncate.go`.
"""

from __future__ import annotations

import unicodedata

_NARROW_CATEGORIES = frozenset({"Mn", "Mc", "Me", "Cf", "Cs", "Zs", "Zl", "Zp"})


def _width(ch: str) -> int:
    if ord(ch) <= 255:
        return 1
    if ch == "\u3000":
        return 2
    return 1 if unicodedata.category(ch) in _NARROW_CATEGORIES else 2


def ellipsis_display(text: str, limit: int) -> str:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    pos = used = offset = index = 0
    invalid = False
    for ch in text:
        invalid = invalid or ch == "\ufffd"
        pos = index
        size = len(ch.encode("utf-8", "surrogatepass"))
        index += size
        width = _width(ch)
        if used + width + 3 > limit:
            break
        used += width
        offset += size
    if len(raw) - pos <= 12:
        following = raw[pos:].decode("utf-8", "surrogatepass")[:4]
        if len(following) <= 3 and used + sum(map(_width, following)) <= limit:
            return text
    kept = raw[:offset].decode("utf-8", "surrogatepass")
    if limit < 3:
        return kept
    return kept + ("..." if invalid else "…")
