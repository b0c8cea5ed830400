"""Row shaping: valid UTF-8, one row per line, the 64 KiB cap on character boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynrunner.executor.reporter.rows import MAX_ROW_BYTES, cap, split_rows, valid_utf8


@pytest.mark.parametrize(
    ("text", "rows"),
    [
        ("", [""]),
        ("one", ["one"]),
        ("one\n", ["one"]),
        ("\n", [""]),
        ("a\n\nb", ["a", "", "b"]),
        ("a\r\nb\r\n", ["a", "b"]),
        ("a\r\r\nb", ["a\r", "b"]),  # only one trailing CR is a line ending
        ("progress 10%\rprogress 20%", ["progress 10%\rprogress 20%"]),
        ("a\n\n", ["a", ""]),
    ],
)
def test_split_rows(text: str, rows: list[str]) -> None:
    assert split_rows(text) == rows


def test_valid_text_is_untouched() -> None:
    for text in ("ascii", "ünïcödé ✓ 🚀", ""):
        assert valid_utf8(text) is text


def test_surrogate_escaped_bytes_are_decoded_or_replaced() -> None:
    raw = "café ✓".encode() + b"\xff\xfe" + b" end"
    smuggled = raw.decode("utf-8", "surrogateescape")
    assert valid_utf8(smuggled) == "café ✓\ufffd\ufffd end"
    # A valid sequence that arrived split into escapes is put back together.
    assert valid_utf8("é".encode().decode("ascii", "surrogateescape")) == "é"


def test_lone_surrogates_are_replaced() -> None:
    assert valid_utf8("a\ud800b\udc00c") == "a\ufffdb\ufffdc"


def test_bytes_are_decoded_with_replacement() -> None:
    assert valid_utf8(b"ok \xc3\x28 \xe2\x82") == "ok \ufffd( \ufffd"


@given(st.binary(max_size=200))
def test_any_bytes_become_encodable_text(data: bytes) -> None:
    for text in (valid_utf8(data), valid_utf8(data.decode("utf-8", "surrogateescape"))):
        text.encode("utf-8")  # never raises


@given(st.text(max_size=50))
def test_any_text_becomes_encodable(text: str) -> None:
    valid_utf8(text).encode("utf-8")


def test_short_rows_are_not_capped() -> None:
    row = "x" * MAX_ROW_BYTES
    assert cap(row) is row


def test_long_ascii_row_is_cut_with_a_marker() -> None:
    row = "x" * (MAX_ROW_BYTES + 10)
    capped = cap(row)
    assert len(capped.encode()) <= MAX_ROW_BYTES
    assert capped.startswith("x" * 60000)
    assert capped.endswith(f"[row truncated: {MAX_ROW_BYTES + 10} bytes, limit {MAX_ROW_BYTES}]")


@pytest.mark.parametrize("char", ["é", "✓", "🚀"])
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_cut_never_splits_a_character(char: str, offset: int) -> None:
    row = "a" * offset + char * (MAX_ROW_BYTES // len(char.encode()) + 5)
    capped = cap(row)
    data = capped.encode("utf-8")  # would raise on a split character
    assert len(data) <= MAX_ROW_BYTES
    body = capped.split(" …[row truncated")[0]
    assert body == row[: len(body)]
    assert len(body.encode()) > MAX_ROW_BYTES - 100
