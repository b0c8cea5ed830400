"""Masker: what is hidden, in which forms, and that it stays correct at scale."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynrunner.proto.masking import MASK, Masker, secret_forms

SECRET = "s3cr3t-T0ken!value"


def test_literal_value_is_masked_everywhere_in_a_line() -> None:
    m = Masker([SECRET])
    assert m.mask(f"a {SECRET} b {SECRET}") == "a *** b ***"
    assert m.mask(f"{SECRET}{SECRET}") == "***"  # adjacent occurrences merge


def test_text_without_secrets_is_returned_unchanged() -> None:
    m = Masker([SECRET])
    line = "nothing to see here"
    assert m.mask(line) is line
    assert Masker().mask(line) is line


@pytest.mark.parametrize("value", ["", "x", " ", " y ", "\n", "\tz\n"])
def test_values_of_length_one_or_less_are_not_masked(value: str) -> None:
    m = Masker([value])
    assert m.forms == frozenset()
    assert m.mask("x y z") == "x y z"


def test_padded_values_are_also_masked_trimmed() -> None:
    m = Masker(["  padded-secret \n"])
    assert m.mask("value=padded-secret;") == "value=***;"


def test_two_character_values_are_masked() -> None:
    assert Masker(["ab"]).mask("cab") == "c***"


def test_multi_line_secret_is_masked_line_by_line() -> None:
    key = "-----BEGIN KEY-----\n  line-one-abc  \r\nline-two-def\n-----END KEY-----\n"
    m = Masker([key])
    assert m.mask("-----BEGIN KEY-----") == MASK
    assert m.mask("    line-one-abc") == "    ***"  # trimmed lines are what is matched
    assert m.mask("x line-two-def y") == "x *** y"
    assert m.mask(key) == "***"
    assert "line-two-def" not in m.mask(json.dumps(key))


def test_multi_line_secret_lines_of_one_character_stay_visible() -> None:
    m = Masker(['{\n  "password": "hunter2hunter2"\n}'])
    assert m.mask("{") == "{"
    assert m.mask("}") == "}"
    assert m.mask('  "password": "hunter2hunter2"') == "  ***"


@pytest.mark.parametrize("prefix", [b"", b"a", b"ab", b"abc", b"user:"])
@pytest.mark.parametrize("suffix", [b"", b"x", b" and more data"])
def test_base64_at_every_alignment(prefix: bytes, suffix: bytes) -> None:
    m = Masker([SECRET])
    encoded = base64.b64encode(prefix + SECRET.encode() + suffix).decode()
    masked = m.mask(encoded)
    assert MASK in masked
    # What is left cannot be decoded back to the secret: at most 4 characters either side.
    visible = masked.replace(MASK, "")
    assert len(visible) <= len(encoded) - len(base64.b64encode(SECRET.encode())) + 8


def test_short_values_get_no_shifted_base64_forms() -> None:
    forms = secret_forms("abcdefg")  # 7 characters
    assert base64.b64encode(b"bcdefg").decode() not in forms
    assert base64.b64encode(b"abcdefg").decode() in forms


def test_json_escaped_forms() -> None:
    value = 'pa"ss\\wörd<&>\n'
    m = Masker([value])
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        assert m.mask(text) == '"***"'
    go_style = json.dumps(value, ensure_ascii=False)[1:-1]
    go_style = go_style.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    assert m.mask(go_style) == MASK


def test_url_escaped_forms() -> None:
    value = "p@ss w/rd&x=1"
    m = Masker([value])
    for encoded in (quote_plus(value, safe=""), quote(value, safe=""), quote(value, safe="$&+:=@")):
        assert m.mask(f"https://h/?token={encoded}&n=1") == "https://h/?token=***&n=1"


def test_command_escaped_form() -> None:
    m = Masker(["100%pure"])
    assert m.mask("::set-output name=x::100%25pure") == "::set-output name=x::***"


def test_overlapping_secrets_are_masked_as_their_union() -> None:
    m = Masker(["abcdef", "defghijk"])
    assert m.mask("xxabcdefghijkyy") == "xx***yy"
    m = Masker(["abc", "bcdefgh"])  # the shorter one starts first
    assert m.mask("abcdefgh!") == "***!"


def test_longest_secret_wins_over_its_prefix() -> None:
    m = Masker(["token", "token-extended-part"])
    assert m.mask("[token-extended-part]") == "[***]"
    assert m.mask("[token-ext]") == "[***-ext]"


def test_unicode_secrets() -> None:
    value = "пароль-🔑-秘密"
    m = Masker([value])
    assert m.mask(f"«{value}»") == "«***»"
    assert m.mask(base64.b64encode(value.encode()).decode()) == MASK
    assert m.mask(json.dumps(value)) == '"***"'


def test_regex_metacharacters_are_literal() -> None:
    m = Masker(["a.b*c(d)[e]$"])
    assert m.mask("a.b*c(d)[e]$") == MASK
    assert m.mask("aXbbbcde") == "aXbbbcde"


def test_added_values_apply_to_later_text_and_are_counted_once() -> None:
    m = Masker()
    m.add("first-secret")
    m.add("first-secret")
    assert len(m) == 1
    assert m.mask("first-secret") == MASK
    m.add("second-secret")
    assert m.mask("first-secret second-secret") == "*** ***"
    assert m.contains_secret("x second-secret")
    assert not m.contains_secret("x second-secre")


def test_many_add_mask_values_all_stay_masked() -> None:
    """Many ::add-mask:: values move between the two compiled expressions."""
    m = Masker()
    values = [f"generated-{i:04d}-value" for i in range(200)]
    for i, value in enumerate(values):
        m.add(value)
        assert m.mask(f"<{value}>") == "<***>"
        assert m.mask(f"<{values[i // 2]}>") == "<***>"
    assert all(m.mask(v) == MASK for v in values)


def test_deeply_nested_prefixes_still_compile() -> None:
    """Each value a prefix of the next: the trie nests deeply; masking must still work."""
    m = Masker("x" + "y" * n for n in range(1, 200))
    assert m.mask("<x" + "y" * 199 + ">") == "<***>"
    assert m.mask("<xy>") == "<***>"


def test_many_secrets_on_a_long_line() -> None:
    secrets = [f"secret-{i}-{i * 7919:x}" for i in range(20)]
    m = Masker(secrets)
    line = " ".join(f"w{i} {s}" for i, s in enumerate(secrets)) * 50
    masked = m.mask(line)
    assert not any(s in masked for s in secrets)
    assert masked.count(MASK) == 20 * 50


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=60)
_secret = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n\0*"), min_size=2, max_size=20)


@settings(max_examples=300, deadline=None)
@given(secrets=st.lists(_secret, min_size=1, max_size=4), parts=st.lists(_text, min_size=1, max_size=5))
def test_no_registered_value_survives_masking(secrets: list[str], parts: list[str]) -> None:
    m = Masker(secrets)
    text = "".join(p + secrets[i % len(secrets)] for i, p in enumerate(parts))
    masked = m.mask(text)
    for s in secrets:
        if len(s.strip()) > 1:
            assert s not in masked.replace(MASK, "\0")


@settings(max_examples=200, deadline=None)
@given(secret=_secret, text=_text)
def test_masking_only_removes_matched_text(secret: str, text: str) -> None:
    m = Masker([secret])
    masked = m.mask(text)
    if not m.contains_secret(text):
        assert masked == text
    else:
        assert MASK in masked


def test_a_long_line_of_near_misses() -> None:
    """Every position starts a prefix of the secret and none completes it: still one linear
    scan (no timing asserted), and the one real occurrence at the end is found."""
    secret = "a" * 30 + "b"
    m = Masker([secret])
    line = "a" * 65_000 + "b"
    assert m.mask(line) == "a" * (65_000 - 30) + MASK


def test_a_huge_value_is_masked_without_a_huge_expression() -> None:
    """`::add-mask::$(base64 -w0 file)` registers one value of hundreds of KiB: its forms are
    matched as literals, not spelled out character by character in a trie (which took seconds and
    hundreds of MiB for 300 KiB and would take the executor down for a few MiB)."""
    import tracemalloc

    value = base64.b64encode(bytes(range(256)) * 900).decode()  # 307 200 characters
    tracemalloc.start()
    try:
        m = Masker(["short-secret", value[:40]])
        m.add(value)
        masked = m.mask(f"<{value}> <{value[:40]}> <short-secret>")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert masked == "<***> <***> <***>"
    assert m.mask(base64.b64encode(value.encode()).decode()) == MASK
    assert peak < 64 * 1024 * 1024, f"{peak / 2**20:.0f} MiB"


def test_a_long_value_wins_over_a_short_one_it_starts_with() -> None:
    long = "k" * 300 + "-tail"
    m = Masker(["kkkk", long])
    assert m.mask(f"[{long}]") == "[***]"
    assert m.mask("[kkkk-x]") == "[***-x]"
