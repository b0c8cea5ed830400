"""The double's copy of Gitea's `util.EllipsisDisplayString` (runner, job, step, run names)."""

from __future__ import annotations

import pytest

from dynrunner.doubles.gitea.truncate import ellipsis_display


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("short", 255, "short"),
        ("abcdefghij", 10, "abcdefghij"),  # fits in bytes: unchanged
        ("abcdefghijk", 10, "abcdefg…"),  # 7 columns + "…"
        ("abcdefghijkl", 12, "abcdefghijkl"),
        ("abcdefghijklm", 12, "abcdefghi…"),
        ("测试测试测试", 12, "测试测试测试"),  # 18 bytes but 12 columns: the last runes fit whole
        ("测试测试测试测试", 12, "测试测试…"),  # CJK counts two columns
        ("a\ufffdbcdefghijk", 10, "a\ufffdbcde..."),  # U+FFFD counts two and turns "…" into "..."
        ("abcdef", 2, ""),  # a limit below 3 leaves no room, and no ellipsis is added
    ],
)
def test_ellipsis_display(text: str, limit: int, expected: str) -> None:
    assert ellipsis_display(text, limit) == expected
