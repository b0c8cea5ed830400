"""Secret masking for everything the executor prints, and for the executor output the
controller quotes when it fails a task on the executor's behalf (one masker for both).

A registered value is hidden as ``***`` in its literal form, line by line when it spans
several lines, and in the encodings it commonly takes on its way into a log (base64 at
every byte alignment, JSON string escapes, URL query and path escapes, workflow-command
escapes), as GitHub's runner and act_runner do.

Speed matters: every log row passes through `Masker.mask`. All forms are compiled into
one regular expression shaped as a trie (alternatives share prefixes), so a line costs a
single scan whatever the number of secrets, and lines without a secret are returned
untouched. Overlapping secrets are masked as the union of every occurrence, so a shorter
secret that starts earlier cannot leave the tail of a longer one visible.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

from dynrunner.proto.assignment import Assignment

MASK = "***"

# Base64 fragments shorter than this match unrelated output too often.
_MIN_B64_FRAGMENT = 8
# Shifted and interior base64 forms only for values at least this long (as act_runner).
_MIN_SHIFTED = 8
# Newly added forms live in a small second expression until there are this many of them,
# or a quarter of the main one, so a stream of ::add-mask:: lines never recompiles
# everything per line.
_RECENT_MIN = 64
# Forms longer than this are found with str.find, not through a regular expression: spelling a
# value of a few hundred KiB (`::add-mask::` of a whole base64 file) into a pattern costs
# seconds and hundreds of MiB in the regex compiler, while only a handful of such forms exist.
_LITERAL_MIN = 257


def _command_escape(value: str) -> str:
    """How workflow-command data spells a value (`::set-output`, `::error::` …)."""
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64_interior(data: bytes, shift: int) -> str:
    """The base64 characters that depend only on `data` when it sits at byte offset
    `shift` (mod 3) inside a longer encoded payload, e.g. ``Basic base64(user:token)``."""
    padded = b"\0" * shift + data
    first = 1 if shift else 0
    last = (shift + len(data)) // 3  # groups [first, last) are made of `data` bytes only
    if last <= first:
        return ""
    return _b64(padded)[4 * first : 4 * last]


def _json_forms(value: str) -> set[str]:
    plain = json.dumps(value, ensure_ascii=False)[1:-1]
    ascii_only = json.dumps(value)[1:-1]
    # Go's encoder (act's toJSON, Gitea) also escapes HTML-significant characters.
    html = (
        plain.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )
    return {plain, ascii_only, html}


def _url_forms(value: str) -> set[str]:
    return {
        quote_plus(value, safe=""),  # form/query encoding, space as "+"
        quote(value, safe=""),  # query encoding, space as "%20"
        quote(value, safe="$&+:=@"),  # path segment (Go's url.PathEscape)
        quote(value, safe="!'()*"),  # JavaScript's encodeURIComponent
    }


def forms_of(value: str) -> set[str]:
    """Every spelling of one value (a whole secret or one of its lines) worth masking."""
    if len(value.strip()) <= 1:
        return set()
    forms = {value}
    if any(c in value for c in "%\r\n"):
        forms.add(_command_escape(value))
    data = value.encode("utf-8", "surrogatepass")
    forms.add(_b64(data))
    if len(value) >= _MIN_SHIFTED:
        forms.add(_b64(data[1:]))
        forms.add(_b64(data[2:]))
        for shift in range(3):
            interior = _b64_interior(data, shift)
            if len(interior) >= _MIN_B64_FRAGMENT:
                forms.add(interior)
    forms |= _json_forms(value)
    forms |= _url_forms(value)
    return {f for f in forms if len(f) > 1}


def secret_forms(value: str) -> set[str]:
    """The forms of a secret: the whole value and each of its lines, trimmed (so a value
    read from a file with a trailing newline, or padded with spaces, is still found)."""
    forms = forms_of(value)
    for line in value.replace("\r", "\n").split("\n"):
        forms |= forms_of(line.strip())
    return forms


def _trie_regex(words: Iterable[str]) -> str:
    """One alternation of `words` as a trie; at any position it matches the longest word."""
    root: dict[str, dict] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def render(node: dict[str, dict]) -> str:
        alternatives = []
        for ch in sorted(k for k in node if k):
            chain = [ch]
            child = node[ch]
            while len(child) == 1 and "" not in child:
                ((nxt, child),) = child.items()
                chain.append(nxt)
            alternatives.append(re.escape("".join(chain)) + render(child))
        if not alternatives:
            return ""
        body = alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"
        return f"(?:{body})?" if "" in node else body

    return render(root)


def _compile(words: set[str]) -> tuple[re.Pattern[str], re.Pattern[str]] | None:
    """(finder, overlap finder) for `words`, or None when there is nothing to find."""
    if not words:
        return None
    try:
        body = _trie_regex(words)
        return re.compile(body), re.compile(f"(?=({body}))")
    except (RecursionError, re.error):
        # Pathologically nested prefixes: a flat alternation, longest first, is slower but safe.
        flat = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
        return re.compile(flat), re.compile(f"(?=({flat}))")


class Masker:
    """The set of values that must never reach a log, and the function that hides them.

    `add` registers a value (task secrets, the task and runtime tokens, ``::add-mask::``
    values). Values whose trimmed length is at most 1 are ignored, as on GitHub: masking
    them would garble every line.
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._main: set[str] = set()
        self._recent: set[str] = set()
        self._pending: set[str] = set()  # added since the expressions were last compiled
        self._main_rx: tuple[re.Pattern[str], re.Pattern[str]] | None = None
        self._recent_rx: tuple[re.Pattern[str], re.Pattern[str]] | None = None
        self._active: list[tuple[re.Pattern[str], re.Pattern[str]]] = []
        self._long: list[str] = []  # forms of at least _LITERAL_MIN characters, longest first
        self._values: set[str] = set()
        for value in values:
            self.add(value)

    def __len__(self) -> int:
        """How many distinct values are registered."""
        return len(self._values)

    @property
    def forms(self) -> frozenset[str]:
        """Every string currently masked (for tests and diagnostics)."""
        return frozenset(self._main | self._recent | self._pending | set(self._long))

    def add(self, value: str) -> None:
        if not value or value in self._values:
            return
        self._values.add(value)
        forms = secret_forms(value)
        long = {f for f in forms if len(f) >= _LITERAL_MIN}
        if long:
            self._long = sorted(set(self._long) | long, key=len, reverse=True)
        self._pending |= forms - long - self._main - self._recent

    def _compile_pending(self) -> None:
        """Compile what `add` collected, at first use: values added together (all task
        secrets at start) cost one compilation, not one each."""
        self._recent |= self._pending
        self._pending = set()
        if len(self._recent) > max(_RECENT_MIN, len(self._main) // 4):
            self._main |= self._recent
            self._recent = set()
            self._main_rx = _compile(self._main)
            self._recent_rx = None
        else:
            self._recent_rx = _compile(self._recent)
        self._active = [rx for rx in (self._main_rx, self._recent_rx) if rx is not None]

    def contains_secret(self, text: str) -> bool:
        """Whether `text` shows any registered value in any masked form."""
        if self._pending:
            self._compile_pending()
        return any(finder.search(text) for finder, _ in self._active) or any(f in text for f in self._long)

    def mask(self, text: str) -> str:
        """`text` with every occurrence of every registered form replaced by ``***``."""
        if self._pending:
            self._compile_pending()
        first = -1
        for finder, _ in self._active:
            found = finder.search(text)
            if found is not None and (first < 0 or found.start() < first):
                first = found.start()
        long_spans = [span for form in self._long for span in _occurrences(text, form)]
        if long_spans:
            start = min(span[0] for span in long_spans)
            first = start if first < 0 else min(first, start)
        if first < 0:
            return text
        spans = [(m.start(), m.end(1)) for _, overlap in self._active for m in overlap.finditer(text, first)]
        spans += long_spans
        spans.sort()
        out: list[str] = []
        pos = 0
        cur_start, cur_end = spans[0]
        for start, end in spans[1:]:
            if start <= cur_end:
                cur_end = max(cur_end, end)
                continue
            out.append(text[pos:cur_start])
            out.append(MASK)
            pos = cur_end
            cur_start, cur_end = start, end
        out.append(text[pos:cur_start])
        out.append(MASK)
        out.append(text[cur_end:])
        return "".join(out)


def _occurrences(text: str, form: str) -> list[tuple[int, int]]:
    """Every (start, end) of `form` in `text`, overlapping ones included."""
    spans = []
    at = text.find(form)
    while at >= 0:
        spans.append((at, at + len(form)))
        at = text.find(form, at + 1)
    return spans


_CONTEXT_TOKENS = ("token", "gitea_runtime_token", "actions_id_token_request_token")


def assignment_values(assignment: Assignment) -> list[str]:
    """Every credential an assignment carries: the task's secrets, the claiming runner's
    token, and the task, runtime and OIDC request tokens of its `github` context."""
    context = assignment.task.context or {}
    values = [*assignment.task.secrets.values(), assignment.runner.token]
    values += [value for key in _CONTEXT_TOKENS if isinstance(value := context.get(key), str)]
    return [value for value in values if value]


# The workflow command `add-mask` in GitHub's two spellings (see the executor's `commands`):
# `::add-mask props::data` after leading whitespace, `##[add-mask props]data` anywhere; the
# name is case-insensitive.
_ADD_MASK = re.compile(r"^[ \t]*::add-mask(?: [^\n]*?)?::(?P<data>.*)$", re.IGNORECASE)
_ADD_MASK_LEGACY = re.compile(r"##\[add-mask(?: [^\]]*)?\](?P<data>.*)$", re.IGNORECASE)
_DATA_ESCAPES: tuple[tuple[str, str], ...] = (("%0D", "\r"), ("%0A", "\n"), ("%25", "%"))
_LEGACY_ESCAPES = (("%3B", ";"), ("%0D", "\r"), ("%0A", "\n"), ("%5D", "]"), ("%25", "%"))


def add_mask_values(text: str) -> list[str]:
    """The values that `add-mask` commands in `text` (a step's raw output) register, escapes
    undone, in order. For output read after the fact, where no executor applied them."""
    values = []
    for raw in text.split("\n"):
        line = raw.removesuffix("\r")
        if "add-mask" not in line.lower():
            continue
        found = _ADD_MASK.match(line)
        table = _DATA_ESCAPES
        if found is None:
            found = _ADD_MASK_LEGACY.search(line)
            table = _LEGACY_ESCAPES
        if found is None:
            continue
        value = found["data"]
        for escaped, plain in table:
            value = value.replace(escaped, plain)
        if value.strip():
            values.append(value)
    return values
