"""`hashFiles()`: the runner's hash of the files matching glob patterns in the workspace.

The runner hands the patterns to a Node script built on `@actions/glob` and hashes, in the
globber's order, the SHA-256 of each regular file under the workspace, returning the
SHA-256 of those digests (hex), or '' when nothing matched. The globber's rules are kept:
one pattern per line, `#` comments, `!` excludes (applied in order), patterns relative to
the workspace, `*`/`?`/`[...]`/`**` matching dot-files too, a pattern naming a directory
taking everything below it, no `..` segments, symbolic links not followed unless the
first argument is `--follow-symbolic-links`; traversal is depth-first with directory
entries in byte order (as Node's `readdir` returns them).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from dynrunner.proto.expressions.errors import ExpressionError

_DIRECTORY, _FILE = 1, 2
_ALL = _DIRECTORY | _FILE


class _Globstar:
    """A `**` segment: any number of path segments."""


_GLOBSTAR = _Globstar()
_Segment = _Globstar | str | re.Pattern[str]


class _PatternError(Exception):
    pass


def _literal(segment: str) -> str:
    """The segment unescaped if it has no glob characters, else '' (`getLiteral`)."""
    out: list[str] = []
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "\\" and i + 1 < len(segment):
            i += 1
            out.append(segment[i])
        elif c in "*?":
            return ""
        elif c == "[" and i + 1 < len(segment):
            close = segment.find("]", i + 1)
            inner = segment[i + 1 : close] if close >= 0 else ""
            if close >= 0 and len(inner.replace("\\", "")) > 1:
                return ""
            if close >= 0 and inner:
                out.append(inner.replace("\\", ""))
                i = close
            else:
                out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _glob_escape(path: str) -> str:
    path = path.replace("\\", "\\\\")
    path = re.sub(r"(\[)(?=[^/]+\])", "[[]", path)
    return path.replace("?", "[?]").replace("*", "[*]")


def _segment_regex(segment: str) -> re.Pattern[str] | str:
    """A minimatch segment (no braces, no extglob) as a regex, or a plain string if literal."""
    out: list[str] = []
    magic = False
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "\\" and i + 1 < len(segment):
            i += 1
            out.append(re.escape(segment[i]))
        elif c == "*":
            magic = True
            out.append("[^/]*")
        elif c == "?":
            magic = True
            out.append("[^/]")
        elif c == "[" and (close := _class_end(segment, i)) > 0:
            magic = True
            body = segment[i + 1 : close]
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            chars = re.sub(r"\\(.)", r"\1", body).replace("\\", "\\\\").replace("]", "\\]").replace("[", "\\[")
            out.append(("[^" if negate else "[") + chars + "]")
            i = close
        else:
            out.append(re.escape(c))
        i += 1
    if not magic:
        return re.sub(r"\\(.)", r"\1", segment)
    return re.compile("(?=.)" + "".join(out), re.DOTALL)  # a glob segment never matches ''


def _class_end(segment: str, start: int) -> int:
    i = start + 1
    if i < len(segment) and segment[i] in "!^":
        i += 1
    if i < len(segment) and segment[i] == "]":
        i += 1
    while i < len(segment):
        if segment[i] == "\\":
            i += 2
            continue
        if segment[i] == "]":
            return i
        i += 1
    return -1


def _match_one(file: list[str], pattern: list[_Segment], partial: bool) -> bool:
    fi = pi = 0
    while fi < len(file) and pi < len(pattern):
        p, f = pattern[pi], file[fi]
        if isinstance(p, _Globstar):
            if pi + 1 == len(pattern):
                return all(s not in (".", "..") for s in file[fi:])
            for fr in range(fi, len(file)):
                if _match_one(file[fr:], pattern[pi + 1 :], partial):
                    return True
                if file[fr] in (".", ".."):
                    return False
            return partial
        if isinstance(p, str):
            if f != p:
                return False
        elif not p.fullmatch(f):
            return False
        fi += 1
        pi += 1
    if fi == len(file) and pi == len(pattern):
        return True
    if fi == len(file):
        return partial
    return fi == len(file) - 1 and file[fi] == ""


class _Pattern:
    def __init__(self, text: str, cwd: str, *, negate: bool = False, implicit: bool = False) -> None:
        text = text.strip()
        while text.startswith("!"):
            negate = not negate
            text = text[1:].strip()
        self.negate, self.implicit = negate, implicit
        literals = [_literal(p) for p in text.split("/") if p]
        first = 1 if text.startswith("/") else 0
        if any((lit == "." and i + first > 0) or lit == ".." for i, lit in enumerate(literals)):
            raise _PatternError(f"Invalid pattern '{text}'. Relative pathing '.' and '..' is not allowed.")
        if text == "." or text.startswith("./"):
            text = _glob_escape(cwd) + text[1:]
        elif text == "~" or text.startswith("~/"):
            text = _glob_escape(str(Path.home())) + text[1:]
        elif not text.startswith("/"):
            text = _glob_escape(cwd).rstrip("/") + "/" + text
        text = re.sub("/+", "/", text)
        self.directories_only = text.endswith("/") and text != "/"
        if self.directories_only:
            text = text.rstrip("/")
        self.segments = [s for s in text.split("/") if s]
        search: list[str] = []
        for segment in self.segments:
            lit = _literal(segment)
            if not lit:
                break
            search.append(lit)
        self.search_path = "/" + "/".join(search)
        self.matcher: list[_Segment] = [""] + [_GLOBSTAR if s == "**" else _segment_regex(s) for s in self.segments]

    def with_descendants(self) -> _Pattern:
        clone = object.__new__(_Pattern)
        clone.__dict__.update(self.__dict__)
        clone.implicit, clone.directories_only = True, False
        clone.segments = [*self.segments, "**"]
        clone.matcher = [*self.matcher, _GLOBSTAR]
        return clone

    def match(self, path: str) -> int:
        if self.segments and self.segments[-1] == "**" and not self.implicit and not path.endswith("/"):
            path += "/"
        elif path != "/":
            path = path.rstrip("/")
        if _match_one(path.split("/"), self.matcher, False):
            return _DIRECTORY if self.directories_only else _ALL
        return 0

    def partial_match(self, path: str) -> bool:
        path = path.rstrip("/") or "/"
        if path == "/":
            return True
        return _match_one(path.split("/"), self.matcher, True)


def _search_paths(patterns: list[_Pattern]) -> list[str]:
    candidates = {p.search_path for p in patterns if not p.negate}
    result: list[str] = []
    for pattern in patterns:
        if pattern.negate or pattern.search_path in result:
            continue
        parent, current = os.path.dirname(pattern.search_path), pattern.search_path
        while parent != current and parent not in candidates:
            parent, current = os.path.dirname(parent), parent
        if parent == current:
            result.append(pattern.search_path)
    return result


def glob(patterns_text: str, cwd: str, *, follow_symlinks: bool) -> Iterator[str]:
    """Paths matching the patterns, in the globber's order (files and directories)."""
    patterns: list[_Pattern] = []
    for raw_line in patterns_text.split("\n"):
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        pattern = _Pattern(line, cwd)
        patterns.append(pattern)
        if pattern.directories_only or pattern.segments[-1:] != ["**"]:
            patterns.append(pattern.with_descendants())
    stack = [(path, 1) for path in reversed(_search_paths(patterns)) if os.path.lexists(path)]
    chain: list[str] = []
    while stack:
        path, level = stack.pop()
        match = 0
        for pattern in patterns:
            match = match & ~pattern.match(path) if pattern.negate else match | pattern.match(path)
        if not match and not any(not p.negate and p.partial_match(path) for p in patterns):
            continue
        try:
            info = os.stat(path) if follow_symlinks else os.lstat(path)
        except FileNotFoundError:
            continue  # a broken link when following links is omitted, as the globber does
        if stat.S_ISDIR(info.st_mode):
            if follow_symlinks:
                real = os.path.realpath(path)
                del chain[level - 1 :]
                if real in chain:
                    continue
                chain.append(real)
            if match & _DIRECTORY:
                yield path
            names = sorted(os.listdir(path), key=os.fsencode)
            stack.extend((os.path.join(path, name), level + 1) for name in reversed(names))
        elif match & _FILE:
            yield path


def hash_files(workspace: Path | str, args: list[str]) -> str:
    """The answer the executor gives the expression language (`EvalEnv.hash_files`)."""
    follow = False
    patterns: list[str] = []
    for i, arg in enumerate(args):
        if i == 0 and arg.startswith("--"):
            if arg.lower() != "--follow-symbolic-links":
                raise ExpressionError(f"Invalid glob option {arg}, avaliable option: '--follow-symbolic-links'.")
            follow = True
            continue
        patterns.append(arg)
    joined = ", ".join(patterns).replace("'", "''")
    root = os.path.realpath(workspace)
    if not os.path.isdir(root):
        raise ExpressionError(f"hashFiles('{joined}') failed. The workspace directory '{root}' does not exist")
    total = hashlib.sha256()
    count = 0
    try:
        for path in glob("\n".join(patterns), root, follow_symlinks=follow):
            if not path.startswith(root + os.sep) or os.path.isdir(path):
                continue
            os.stat(path)  # a broken link fails the function, as in the runner
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            total.update(digest.digest())
            count += 1
    except (OSError, _PatternError) as error:
        raise ExpressionError(
            f"hashFiles('{joined}') failed. Fail to hash files under directory '{root}': {error}"
        ) from None
    return total.hexdigest() if count else ""
