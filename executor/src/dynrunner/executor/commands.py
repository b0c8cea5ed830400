"""Workflow commands in a step's output (`::name k=v,...::data` and the legacy `##[name k=v;...]data`).

A `CommandProcessor` reads one step's output line by line and turns each line into the row
the log shows (or none) plus effects the job applies after the step. What it does follows
GitHub's runner (`ActionCommandManager`), rendered for Gitea's log view, which labels rows
starting with `##[error]`, `##[warning]`, `##[notice]`, `##[debug]` and folds on
`::group::`/`##[group]`:

- `add-mask`: the value (and each of its lines) is masked from then on; the row is dropped.
- `error`/`warning`/`notice`: `##[error]file:line:col: title: message` (Gitea stores no
  annotations, so the location goes into the row).
- `debug`: `##[debug]message`, only when step debug logging is on (`ACTIONS_STEP_DEBUG`).
- `group`/`endgroup`, `add-matcher`/`remove-matcher`: passed through for the UI.
- `stop-commands::TOKEN` ... `::TOKEN::`: lines in between are plain output. The token may
  not be empty, `pause-logging` or a command name (GitHub's rule), unless
  `ACTIONS_ALLOW_UNSECURE_STOPCOMMAND_TOKENS` is true.
- `set-output`/`save-state`: deprecated on GitHub but still honoured there; honoured here,
  with GitHub's deprecation warning.
- `set-env`/`add-path`: disabled as on GitHub (they let untrusted output change every later
  step's environment); they fail the step unless `ACTIONS_ALLOW_UNSECURE_COMMANDS` is true.
  `NODE_OPTIONS` can never be set this way.
- Anything else, including unknown `::name::` lines, is ordinary output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

REGISTERED = frozenset(
    {
        "add-mask",
        "debug",
        "error",
        "warning",
        "notice",
        "group",
        "endgroup",
        "stop-commands",
        "set-output",
        "save-state",
        "set-env",
        "add-path",
        "add-matcher",
        "remove-matcher",
    }
)
BLOCKED_ENV = frozenset({"NODE_OPTIONS"})

DEPRECATED_MESSAGE = (
    "The `{0}` command is deprecated and will be disabled soon. Please upgrade to using Environment Files. "
    "For more information see: https://github.blog/changelog/2022-10-11-github-actions-deprecating-save-state-and-set-output-commands/"
)
DISABLED_MESSAGE = (
    "The `{0}` command is disabled. Please upgrade to using Environment Files or opt into unsecure command "
    "execution by setting the `ACTIONS_ALLOW_UNSECURE_COMMANDS` environment variable to `true`."
)
BAD_STOP_TOKEN_MESSAGE = (
    "You cannot use a endToken that is an empty string, the string 'pause-logging', or another workflow command. "
    "Set `ACTIONS_ALLOW_UNSECURE_STOPCOMMAND_TOKENS` to `true` to allow it."
)

_DATA_ESCAPES = (("%0D", "\r"), ("%0A", "\n"), ("%25", "%"))
_PROPERTY_ESCAPES = (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%"))
_LEGACY_ESCAPES = (("%3B", ";"), ("%0D", "\r"), ("%0A", "\n"), ("%5D", "]"), ("%25", "%"))


def _unescape(text: str, table: tuple[tuple[str, str], ...]) -> str:
    if "%" not in text:
        return text
    for escaped, plain in table:
        text = text.replace(escaped, plain)
    return text


def escape_data(text: str) -> str:
    """Escape the data part of a command the runner writes itself."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


@dataclass(slots=True)
class Command:
    name: str
    properties: dict[str, str]
    data: str


def parse(line: str, names: frozenset[str] = REGISTERED) -> Command | None:
    """A command named in `names` on `line`, or None. GitHub's two forms: `::name props::data`
    (after leading whitespace) and `##[name props]data` (anywhere on the line). Names are
    case-insensitive, as on GitHub."""
    stripped = line.lstrip()
    if stripped.startswith("::"):
        end = stripped.find("::", 2)
        if end >= 0:
            info = stripped[2:end]
            name, _, props = info.partition(" ")
            name = name.lower()
            if name in names:
                properties: dict[str, str] = {}
                for pair in props.strip().split(","):
                    key, sep, value = pair.partition("=")
                    if sep and key and value:
                        properties[key] = _unescape(value, _PROPERTY_ESCAPES)
                return Command(name, properties, _unescape(stripped[end + 2 :], _DATA_ESCAPES))
    start = line.find("##[")
    if start >= 0:
        end = line.find("]", start)
        if end >= 0:
            name, _, props = line[start + 3 : end].partition(" ")
            name = name.lower()
            if name in names:
                properties = {}
                for pair in props.split(";"):
                    key, sep, value = pair.partition("=")
                    if sep and key and value:
                        properties[key] = _unescape(value, _LEGACY_ESCAPES)
                return Command(name, properties, _unescape(line[end + 1 :], _LEGACY_ESCAPES))
    return None


def annotation(level: str, properties: dict[str, str], message: str) -> list[str]:
    """Rows for an error/warning/notice: the location and title first, one row per line."""
    props = {k.lower(): v for k, v in properties.items()}
    prefix = props.get("file", "")
    if prefix:
        line = props.get("line", "")
        col = props.get("col") or props.get("column", "")
        if line:
            prefix += f":{line}" + (f":{col}" if col else "")
        prefix += ": "
    if props.get("title"):
        prefix += props["title"] + ": "
    lines = (prefix + message).splitlines() or [""]
    return [f"##[{level}]{text}" for text in lines]


@dataclass(slots=True)
class StepEffects:
    """What the step's commands asked for, applied by the job after the step."""

    outputs: dict[str, str] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class CommandProcessor:
    """One step's output → log rows. `feed` returns the rows for one output line."""

    __slots__ = ("_add_mask", "_allow_stop_tokens", "_allow_unsecure", "_debug", "_stop_token", "_warned", "effects")

    def __init__(
        self,
        add_mask: Callable[[str], None],
        *,
        debug: bool = False,
        allow_unsecure_commands: bool = False,
        allow_unsecure_stop_tokens: bool = False,
    ) -> None:
        self._add_mask = add_mask
        self._debug = debug
        self._allow_unsecure = allow_unsecure_commands
        self._allow_stop_tokens = allow_unsecure_stop_tokens
        self._stop_token: str | None = None
        self._warned: set[str] = set()
        self.effects = StepEffects()

    def feed(self, line: str) -> list[str]:
        if "::" not in line and "##[" not in line:
            return [line]
        if self._stop_token is not None:
            if parse(line, frozenset({self._stop_token})) is not None:
                self._stop_token = None
                return []
            return [line]
        command = parse(line)
        if command is None:
            return [line]
        return self._apply(line, command)

    def writer(self, log: Callable[[str], None]) -> Callable[[list[str]], None]:
        """Lines of output in, rows to `log` out (commands applied), one call per chunk."""
        feed = self.feed

        def write(lines: list[str]) -> None:
            rows: list[str] = []
            append = rows.append
            for line in lines:
                if "::" in line or "##[" in line:
                    rows.extend(feed(line))
                else:
                    append(line)
            if rows:
                log("\n".join(rows) + "\n")

        return write

    def _apply(self, line: str, cmd: Command) -> list[str]:
        name = cmd.name
        if name == "add-mask":
            value = cmd.data
            if not value.strip():
                return ["##[warning]Can't add secret mask for empty string in ##[add-mask] command."]
            self._add_mask(value)
            for part in value.replace("\r", "\n").split("\n"):
                if part.strip():
                    self._add_mask(part.strip())
            return []
        if name in ("error", "warning", "notice"):
            return annotation(name, cmd.properties, cmd.data)
        if name == "debug":
            return [f"##[debug]{text}" for text in cmd.data.splitlines() or [""]] if self._debug else []
        if name in ("group", "endgroup", "add-matcher", "remove-matcher"):
            return [line]
        if name == "stop-commands":
            return self._stop(cmd.data)
        if name in ("set-output", "save-state"):
            key = cmd.properties.get("name", "")
            rows = self._deprecation(name)
            if not key:
                self.effects.errors.append(f"Required field 'name' is missing in ##[{name}] command.")
                return [*rows, f"##[error]Unable to process command '{line.strip()}' successfully."]
            (self.effects.outputs if name == "set-output" else self.effects.state)[key] = cmd.data
            return rows
        if name in ("set-env", "add-path"):
            return self._unsecure(line, cmd)
        return [line]

    def _deprecation(self, name: str) -> list[str]:
        if name in self._warned:
            return []
        self._warned.add(name)
        return [f"##[warning]{DEPRECATED_MESSAGE.format(name)}"]

    def _stop(self, token: str) -> list[str]:
        invalid = not token or token.lower() == "pause-logging" or token in REGISTERED
        if invalid and not self._allow_stop_tokens:
            self.effects.errors.append(BAD_STOP_TOKEN_MESSAGE)
            return [f"##[error]{BAD_STOP_TOKEN_MESSAGE}"]
        if len(token) > 6:
            self._add_mask(token)
        self._stop_token = token.lower()
        return []

    def _unsecure(self, line: str, cmd: Command) -> list[str]:
        if not self._allow_unsecure:
            message = DISABLED_MESSAGE.format(cmd.name)
            self.effects.errors.append(message)
            return [f"##[error]Unable to process command '{line.strip()}' successfully.", f"##[error]{message}"]
        if cmd.name == "add-path":
            if cmd.data:
                self.effects.path.append(cmd.data)
            return []
        key = cmd.properties.get("name", "")
        if not key:
            self.effects.errors.append("Required field 'name' is missing in ##[set-env] command.")
            return ["##[error]Required field 'name' is missing in ##[set-env] command."]
        if key.upper() in BLOCKED_ENV:
            return [f"##[error]Can't update {key.upper()} environment variable using ::set-env:: command."]
        self.effects.env[key] = cmd.data
        return []
