"""The double's metadata label rules decide exactly as the real server's validator does
(`opensandbox_server.services.validators.ensure_metadata_labels`), on generated keys and values."""

from __future__ import annotations

import warnings

import pytest
from fastapi import HTTPException
from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # the server's models use pydantic-1 idioms that pydantic 2 warns about
    warnings.simplefilter("ignore")
    from opensandbox_server.services.validators import ensure_metadata_labels

from dynrunner.doubles.opensandbox.errors import ApiError, check_metadata

_PIECES = st.sampled_from(["a", "Z", "0", "-", "_", ".", "/", "opensandbox.io/", "x" * 30, " ", "é", ""])
_TEXT = st.lists(_PIECES, max_size=8).map("".join)


def _real(metadata: dict[str, str]) -> tuple[int, str] | None:
    try:
        ensure_metadata_labels(metadata)
    except HTTPException as err:
        return err.status_code, err.detail["code"]
    return None


def _double(metadata: dict[str, str]) -> tuple[int, str] | None:
    try:
        check_metadata(metadata)
    except ApiError as err:
        return err.status, err.code
    return None


@settings(max_examples=400, deadline=None)
@given(key=_TEXT, value=_TEXT)
def test_one_label_gets_the_same_verdict(key: str, value: str) -> None:
    assert _double({key: value}) == _real({key: value})


@pytest.mark.parametrize(
    "key",
    [
        "dynrunner-assignment-id",
        "dynrunner.io/pool",
        "a/b",
        "example.com/x",
        "Example.com/x",
        "a" * 64,
        "-a",
        "a-",
        "a..b",
    ],
)
def test_chosen_keys(key: str) -> None:
    assert _double({key: "v"}) == _real({key: "v"})
