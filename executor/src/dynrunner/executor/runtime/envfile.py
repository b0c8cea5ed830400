"""GitHub's environment-file format (GITHUB_OUTPUT, GITHUB_ENV, GITHUB_STATE), parsed exactly as
actions/runner's `EnvFileKeyValuePairs` does on Linux.

- Lines end at LF; a CR stays part of the line, and an empty line is skipped.
- `name=value`, or `name<<DELIMITER` followed by value lines and a line equal to DELIMITER:
  whichever of `=` and `<<` comes first in the line decides. A multi-line value is its lines
  joined with `\\n` (the newline before the delimiter line is not part of it).
- A UTF-8 byte order mark at the start is ignored; invalid UTF-8 becomes U+FFFD, as .NET reads it.

Unlike GitHub, an empty name in the `name=value` form is an error (GitHub accepts it by mistake).
The parser streams, so a huge file is rejected as soon as one value passes a limit without being
read into memory (see `outputs.read_output_file`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, NoReturn

_BOM = b"\xef\xbb\xbf"
_SHOWN = 1 << 20
"""How much of an offending line an error message repeats: more than a log row shows (64 KiB),
because the reporter masks secrets in the whole message before it cuts the row. Cut shorter
here, a secret quoted across the cut (a token echoed into $GITHUB_ENV) would show in part."""


class EnvFileError(ValueError):
    """A line of an environment file does not follow the format. The message reads like GitHub's
    and names the file and the line."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        super().__init__(f"{reason} ({source}, line {line})")
        self.source = source
        self.line = line
        self.reason = reason


OversizeHook = Callable[[str, int, int], NoReturn]
"""Called with (name, value size in bytes, line number) when a value passes `max_value`; must raise."""


def parse_env_file(data: bytes | str, *, source: str) -> list[tuple[str, str]]:
    """All `(name, value)` pairs of an environment file, in file order (a later pair for the same
    name is meant to win; the caller applies that). Raises EnvFileError."""
    raw = data.encode() if isinstance(data, str) else data
    return list(iter_env_stream(io.BytesIO(raw), source=source))


def iter_env_stream(
    fp: BinaryIO,
    *,
    source: str,
    max_value: int | None = None,
    on_oversize: OversizeHook | None = None,
) -> Iterator[tuple[str, str]]:
    """Stream the pairs of an environment file. With `max_value`, a value longer than that many bytes
    is never held in memory: its size is counted and `on_oversize` raises."""
    if max_value is not None and on_oversize is None:
        raise ValueError("max_value needs on_oversize")
    cap = None if max_value is None else max_value + 64 * 1024
    lines = _Lines(fp, cap)
    for line in lines:
        if line.length == 0:
            continue
        head = line.data
        eq = head.find(b"=")
        heredoc = head.find(b"<<")
        if eq >= 0 and (heredoc < 0 or eq < heredoc):
            name = _text(head[:eq])
            if not name:
                raise EnvFileError(source, line.number, f"Invalid format {_quote(head)}. Name must not be empty")
            size = line.length - eq - 1
            if line.truncated:
                assert on_oversize is not None
                on_oversize(name, size, line.number)
            value = _text(head[eq + 1 :])
            if max_value is not None and on_oversize is not None and len(value.encode()) > max_value:
                on_oversize(name, len(value.encode()), line.number)
            yield name, value
        elif heredoc >= 0:
            if line.truncated:
                raise EnvFileError(source, line.number, f"Invalid format {_quote(head)}: the line is too long")
            name = _text(head[:heredoc])
            delimiter = head[heredoc + 2 :]
            if not name or not delimiter:
                raise EnvFileError(
                    source,
                    line.number,
                    f"Invalid format {_quote(head)}. Name must not be empty and delimiter must not be empty",
                )
            yield name, _read_heredoc(lines, name, delimiter, line.number, source, max_value, on_oversize)
        elif line.truncated:
            raise EnvFileError(
                source, line.number, f"Invalid format: {line.length} bytes without '=' or '<<' in the first {cap}"
            )
        else:
            raise EnvFileError(source, line.number, f"Invalid format {_quote(head)}")


def _read_heredoc(
    lines: _Lines,
    name: str,
    delimiter: bytes,
    start: int,
    source: str,
    max_value: int | None,
    on_oversize: OversizeHook | None,
) -> str:
    parts: list[bytes] = []
    size = -1  # bytes of the value so far, counting the "\n" between lines
    for line in lines:
        if not line.truncated and line.data == delimiter:
            if max_value is not None and on_oversize is not None and size > max_value:
                on_oversize(name, size, start)
            return _text(b"\n".join(parts))
        if not line.newline:
            raise EnvFileError(source, start, "Invalid value. EOF marker missing new line.")
        size += line.length + 1
        if max_value is None or size <= max_value:
            parts.append(line.data)
        else:
            parts.clear()  # too large already: keep counting, stop holding
    raise EnvFileError(source, start, f"Invalid value. Matching delimiter not found {_quote(delimiter)}")


@dataclass(slots=True)
class _Line:
    number: int
    data: bytes
    """The line without its LF; only the first `cap` bytes when truncated."""
    length: int
    newline: bool
    truncated: bool


class _Lines:
    """LF-separated lines of a binary stream; a line longer than `cap` bytes is counted, not kept."""

    def __init__(self, fp: BinaryIO, cap: int | None) -> None:
        self._fp = fp
        self._cap = cap
        self._number = 0
        self._first = True

    def __iter__(self) -> Iterator[_Line]:
        return self

    def __next__(self) -> _Line:
        limit = -1 if self._cap is None else self._cap + 1
        data = self._fp.readline(limit)
        if self._first:
            self._first = False
            if data.startswith(_BOM):
                data = data[len(_BOM) :]
                if not data:
                    data = self._fp.readline(limit)
        if not data:
            raise StopIteration
        self._number += 1
        if data.endswith(b"\n"):
            return _Line(self._number, data[:-1], len(data) - 1, True, False)
        if self._cap is None or len(data) <= self._cap:
            return _Line(self._number, data, len(data), False, False)
        length = len(data)
        newline = False
        while chunk := self._fp.readline(1 << 20):
            if chunk.endswith(b"\n"):
                length += len(chunk) - 1
                newline = True
                break
            length += len(chunk)
        return _Line(self._number, data[: self._cap], length, newline, True)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _quote(raw: bytes) -> str:
    text = _text(raw)
    if len(text) > _SHOWN:
        text = text[:_SHOWN] + "…"
    return f"'{text}'"
