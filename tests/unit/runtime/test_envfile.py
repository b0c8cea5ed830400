"""GitHub's environment-file format, with the cases of actions/runner's SetEnvFileCommandL0 (files
written there with a UTF-8 BOM, joined with LF) and the errors it raises."""

from __future__ import annotations

import pytest

from dynrunner.executor.runtime.envfile import EnvFileError, parse_env_file

BOM = "\ufeff"


def github_file(*lines: str, newline: str = "\n") -> bytes:
    """What actions/runner's tests write: a BOM, then the lines joined (no final newline)."""
    return (BOM + newline.join(lines)).encode()


def parse(data: bytes | str) -> list[tuple[str, str]]:
    return parse_env_file(data, source="GITHUB_ENV")


def test_empty_file() -> None:
    assert parse(b"") == []
    assert parse(github_file()) == []


def test_simple() -> None:
    assert parse(github_file("MY_ENV=MY VALUE")) == [("MY_ENV", "MY VALUE")]


def test_skips_empty_lines() -> None:
    data = github_file("", "MY_ENV=my value", "", "MY_ENV_2=my second value", "")
    assert parse(data) == [("MY_ENV", "my value"), ("MY_ENV_2", "my second value")]


def test_empty_value() -> None:
    assert parse(github_file("MY_ENV=")) == [("MY_ENV", "")]


def test_multiple_values() -> None:
    data = github_file("MY_ENV=my value", "MY_ENV_2=", "MY_ENV_3=my third value")
    assert parse(data) == [("MY_ENV", "my value"), ("MY_ENV_2", ""), ("MY_ENV_3", "my third value")]


def test_equals_signs_in_values() -> None:
    data = github_file("MY_ENV==abc", "MY_ENV_2=def=ghi", "MY_ENV_3=jkl=")
    assert parse(data) == [("MY_ENV", "=abc"), ("MY_ENV_2", "def=ghi"), ("MY_ENV_3", "jkl=")]


def test_heredoc() -> None:
    data = github_file("MY_ENV<<EOF", "line one", "line two", "line three", "EOF")
    assert parse(data) == [("MY_ENV", "line one\nline two\nline three")]


def test_heredoc_empty_value() -> None:
    assert parse(github_file("MY_ENV<<EOF", "EOF")) == [("MY_ENV", "")]


def test_heredoc_skips_empty_lines_between_entries() -> None:
    data = github_file("", "MY_ENV<<EOF", "hello", "world", "EOF", "", "MY_ENV_2<<EOF", "HELLO", "AGAIN", "EOF", "")
    assert parse(data) == [("MY_ENV", "hello\nworld"), ("MY_ENV_2", "HELLO\nAGAIN")]


def test_heredoc_special_characters() -> None:
    data = github_file(
        "MY_ENV<<=EOF", "hello", "one", "=EOF",
        "MY_ENV_2<<<EOF", "hello", "two", "<EOF",
        "MY_ENV_3<<EOF", "hello", "", "three", "", "EOF",
        "MY_ENV_4<<EOF", "hello=four", "EOF",
        "MY_ENV_5<<EOF", " EOF", "EOF",
    )  # fmt: skip
    assert parse(data) == [
        ("MY_ENV", "hello\none"),
        ("MY_ENV_2", "hello\ntwo"),
        ("MY_ENV_3", "hello\n\nthree\n"),
        ("MY_ENV_4", "hello=four"),
        ("MY_ENV_5", " EOF"),
    ]


def test_whichever_of_equals_and_heredoc_comes_first_decides() -> None:
    assert parse("A=b<<c\n") == [("A", "b<<c")]
    assert parse("A<<X=Y\nv\nX=Y\n") == [("A", "v")]


def test_a_later_entry_for_the_same_name_is_returned_after_the_earlier_one() -> None:
    assert parse("A=1\nA=2\n") == [("A", "1"), ("A", "2")]


def test_delimiter_on_the_last_line_needs_no_newline() -> None:
    assert parse("A<<EOF\nx\nEOF") == [("A", "x")]


def test_carriage_returns_stay_part_of_lines_as_on_linux_runners() -> None:
    assert parse("A=1\r\n") == [("A", "1\r")]
    assert parse("A<<EOF\r\nx\r\nEOF\r\n") == [("A", "x\r")]  # the delimiter is "EOF\r"
    with pytest.raises(EnvFileError, match="Matching delimiter not found 'EOF'"):
        parse("A<<EOF\nx\r\nEOF\r\n")


def test_invalid_utf8_becomes_replacement_characters() -> None:
    assert parse(b"A=caf\xe9\n") == [("A", "caf\ufffd")]


def test_str_input_is_accepted() -> None:
    assert parse("GREETING=grüß dich\n") == [("GREETING", "grüß dich")]


def test_heredoc_missing_newline_means_the_delimiter_is_never_found() -> None:
    data = github_file("MY_ENV<<EOF", "line one", "line two", "line three", "EOF", newline=" ")
    with pytest.raises(EnvFileError, match="Matching delimiter not found"):
        parse(data)


def test_heredoc_whose_last_line_glues_the_delimiter_reports_the_missing_newline() -> None:
    with pytest.raises(EnvFileError) as info:
        parse("MY_ENV<<EOF\nline one\nline twoEOF")
    assert str(info.value) == "Invalid value. EOF marker missing new line. (GITHUB_ENV, line 1)"


def test_missing_delimiter_names_the_delimiter_file_and_line() -> None:
    with pytest.raises(EnvFileError) as info:
        parse("A=1\n\nB<<END\nvalue\n")
    assert str(info.value) == "Invalid value. Matching delimiter not found 'END' (GITHUB_ENV, line 3)"
    assert (info.value.source, info.value.line) == ("GITHUB_ENV", 3)


def test_a_line_with_neither_form_is_an_error() -> None:
    with pytest.raises(EnvFileError) as info:
        parse("A=1\njust some words\n")
    assert str(info.value) == "Invalid format 'just some words' (GITHUB_ENV, line 2)"


def test_an_empty_name_is_an_error_in_both_forms() -> None:
    with pytest.raises(EnvFileError, match=r"^Invalid format '=value'. Name must not be empty \(GITHUB_ENV, line 1\)$"):
        parse("=value\n")
    with pytest.raises(
        EnvFileError,
        match=r"^Invalid format '<<EOF'. Name must not be empty and delimiter must not be empty \(GITHUB_ENV, line 1\)",
    ):
        parse("<<EOF\nx\nEOF\n")


def test_an_empty_delimiter_is_an_error() -> None:
    with pytest.raises(EnvFileError, match="delimiter must not be empty"):
        parse("NAME<<\nx\n\n")


def test_error_messages_shorten_only_lines_longer_than_a_row() -> None:
    """The reporter masks the whole message, then cuts the row: a quote cut short here could show
    part of a secret (a token echoed into $GITHUB_ENV), so only lines beyond 1 MiB are shortened."""
    with pytest.raises(EnvFileError) as info:
        parse("x" * 10_000 + "\n")
    assert "x" * 10_000 in str(info.value) and "…" not in str(info.value)
    with pytest.raises(EnvFileError) as info:
        parse("x" * (3 << 20) + "\n")
    assert len(str(info.value)) < (1 << 20) + 100
    assert "…" in str(info.value)
