"""The task's `log_indexes` column is appended to as text, and stays the JSON list it was."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from dynrunner.doubles.gitea.logs import appended_indexes
from dynrunner.doubles.gitea.store import dumps

offsets = st.lists(st.integers(min_value=0, max_value=2**40))


@given(offsets, offsets)
def test_appending_equals_re_serializing(before: list[int], added: list[int]) -> None:
    text = appended_indexes(dumps(before), added)
    assert text == dumps(before + added)
    assert json.loads(text) == before + added
