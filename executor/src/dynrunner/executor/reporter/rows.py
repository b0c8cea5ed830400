"""Shaping text into Gitea log rows: valid UTF-8, one row per line, at most 64 KiB each.

Gitea stores a row as one line of its log file and cuts content longer than
``MaxLineSize`` (65536 bytes) at a byte offset, which can split a character; protobuf
strings must be valid UTF-8 or the whole request fails. So the executor repairs and
cuts rows itself, on character boundaries, and says so in the row.
"""

from __future__ import annotations

import codecs

MAX_ROW_BYTES = 64 * 1024
REPLACEMENT = "\ufffd"

_ERRORS = "dynrunner-log-utf8"


def _repair(err: UnicodeError) -> tuple[bytes, int]:
    """Encode-error handler: bytes smuggled in as surrogate escapes come back as bytes
    (and are then judged by the UTF-8 decoder); any other lone surrogate becomes U+FFFD."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    out = bytearray()
    for ch in err.object[err.start : err.end]:
        code = ord(ch)
        out += bytes([code - 0xDC00]) if 0xDC80 <= code <= 0xDCFF else REPLACEMENT.encode()
    return bytes(out), err.end


codecs.register_error(_ERRORS, _repair)


def valid_utf8(text: str | bytes) -> str:
    """`text` as a string that encodes to valid UTF-8; invalid sequences become U+FFFD."""
    if isinstance(text, bytes | bytearray | memoryview):
        return bytes(text).decode("utf-8", "replace")
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", _ERRORS).decode("utf-8", "replace")
    return text


def split_rows(text: str) -> list[str]:
    """One entry per line: split on ``\\n``, drop one trailing ``\\r`` per line, and do not
    turn a final newline into an extra empty row. An empty text is one empty row."""
    lines = text.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def truncation_marker(total: int) -> str:
    return f" …[row truncated: {total} bytes, limit {MAX_ROW_BYTES}]"


def cap(content: str, limit: int = MAX_ROW_BYTES) -> str:
    """`content` cut to at most `limit` UTF-8 bytes, on a character boundary, ending with a
    visible marker when anything was cut."""
    if len(content) * 4 <= limit:
        return content
    data = content.encode("utf-8")
    if len(data) <= limit:
        return content
    marker = truncation_marker(len(data))
    keep = limit - len(marker.encode("utf-8"))
    while keep > 0 and (data[keep] & 0xC0) == 0x80:
        keep -= 1
    return data[:keep].decode("utf-8") + marker
