"""Workflow commands in step output, processed as GitHub's runner processes them."""

from __future__ import annotations

import pytest

from dynrunner.executor.commands import BAD_STOP_TOKEN_MESSAGE, CommandProcessor, annotation, parse


def processor(**options: bool) -> tuple[CommandProcessor, list[str]]:
    masks: list[str] = []
    return CommandProcessor(masks.append, **options), masks


def test_plain_lines_pass_through() -> None:
    p, _ = processor()
    for line in ("hello", "", "a :: b", "::not-a-command::x", "  ::unknown thing::", "::"):
        assert p.feed(line) == [line]


def test_parse_both_forms_and_escapes() -> None:
    cmd = parse("::error file=a%2Cb.py,line=3,title=T%3Ax::first%0Asecond %25 done")
    assert cmd is not None
    assert (cmd.name, cmd.properties, cmd.data) == (
        "error",
        {"file": "a,b.py", "line": "3", "title": "T:x"},
        "first\nsecond % done",
    )
    legacy = parse("prefix ##[warning file=x.c;line=2]careful%3B%5D")
    assert legacy is not None
    assert (legacy.name, legacy.properties, legacy.data) == ("warning", {"file": "x.c", "line": "2"}, "careful;]")
    assert parse("   ::Group::Title") is not None  # leading blanks and case are accepted, as on GitHub
    assert parse("::group") is None


def test_add_mask_registers_the_value_and_each_line_and_drops_the_row() -> None:
    p, masks = processor()
    assert p.feed("::add-mask::multi%0Aline secret") == []
    assert masks == ["multi\nline secret", "multi", "line secret"]
    assert p.feed("::add-mask::   ") == ["##[warning]Can't add secret mask for empty string in ##[add-mask] command."]


def test_annotations_carry_location_and_title() -> None:
    p, _ = processor()
    assert p.feed("::error file=main.go,line=12,col=5,title=vet::undefined: x") == [
        "##[error]main.go:12:5: vet: undefined: x"
    ]
    assert p.feed("::warning::two%0Alines") == ["##[warning]two", "##[warning]lines"]
    assert p.feed("::notice::fyi") == ["##[notice]fyi"]
    assert annotation("error", {"File": "x", "column": "2", "line": "1"}, "m") == ["##[error]x:1:2: m"]


def test_debug_only_with_step_debug() -> None:
    quiet, _ = processor()
    loud, _ = processor(debug=True)
    assert quiet.feed("::debug::details") == []
    assert loud.feed("::debug::details") == ["##[debug]details"]


def test_group_and_matchers_pass_through() -> None:
    p, _ = processor()
    for line in ("::group::Build", "::endgroup::", "::add-matcher::m.json", "::remove-matcher owner=x::"):
        assert p.feed(line) == [line]


def test_stop_commands_until_the_token() -> None:
    p, masks = processor()
    assert p.feed("::stop-commands::pause-token-123") == []
    assert masks == ["pause-token-123"]  # tokens longer than 6 characters are masked, as on GitHub
    assert p.feed("::add-mask::not-a-secret") == ["::add-mask::not-a-secret"]
    assert p.feed("::error::not an error") == ["::error::not an error"]
    assert p.feed("::pause-token-123::") == []
    assert p.feed("::error::now an error") == ["##[error]now an error"]
    assert masks == ["pause-token-123"]


@pytest.mark.parametrize("token", ["", "pause-logging", "error"])
def test_stop_commands_refuses_unsafe_tokens(token: str) -> None:
    p, _ = processor()
    assert p.feed(f"::stop-commands::{token}") == [f"##[error]{BAD_STOP_TOKEN_MESSAGE}"]
    assert p.effects.errors == [BAD_STOP_TOKEN_MESSAGE]
    assert p.feed("::error::still processed") == ["##[error]still processed"]
    allowed, _ = processor(allow_unsecure_stop_tokens=True)
    assert allowed.feed(f"::stop-commands::{token}") == []


def test_set_output_and_save_state_are_honoured_with_one_warning() -> None:
    p, _ = processor()
    rows = p.feed("::set-output name=answer::4%0A2")
    assert len(rows) == 1 and rows[0].startswith("##[warning]The `set-output` command is deprecated")
    assert p.feed("::set-output name=other::x") == []
    assert p.feed("::save-state name=pid::12") and p.effects.state == {"pid": "12"}
    assert p.effects.outputs == {"answer": "4\n2", "other": "x"}
    assert p.feed("::set-output::no name")[-1].startswith("##[error]Unable to process command")
    assert p.effects.errors == ["Required field 'name' is missing in ##[set-output] command."]


def test_set_env_and_add_path_are_disabled_unless_allowed() -> None:
    p, _ = processor()
    rows = p.feed("::set-env name=X::1")
    assert rows[0] == "##[error]Unable to process command '::set-env name=X::1' successfully."
    assert "The `set-env` command is disabled" in rows[1]
    assert p.feed("::add-path::/opt/bin")[1].startswith("##[error]The `add-path` command is disabled")
    assert len(p.effects.errors) == 2 and not p.effects.env and not p.effects.path

    allowed, _ = processor(allow_unsecure_commands=True)
    assert allowed.feed("::set-env name=X::1") == []
    assert allowed.feed("::set-env name=node_options::--inspect") == [
        "##[error]Can't update NODE_OPTIONS environment variable using ::set-env:: command."
    ]
    assert allowed.feed("::add-path::/opt/bin") == []
    assert allowed.effects.env == {"X": "1"} and allowed.effects.path == ["/opt/bin"]
    assert allowed.effects.errors == []
