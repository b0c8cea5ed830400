"""Property and index dereference, object filters (`*`), and case rules for keys.

Examples from GitHub's documentation ("Object filters") and the runner's `Index` node.
"""

from __future__ import annotations

from typing import Any

import pytest

from dynrunner.proto.expressions import EvalEnv, ExpressionError, evaluate
from tests.fixtures.expressions import ev

FRUITS = [
    {"name": "apple", "quantity": 1},
    {"name": "orange", "quantity": 2},
    {"name": "pear", "quantity": 1},
]
VEGETABLES = {
    "scallions": {"colors": ["green", "white", "red"], "ediblePortions": ["roots", "stalks"]},
    "beets": {"colors": ["purple", "red", "gold", "white", "pink"], "ediblePortions": ["roots", "stems", "leaves"]},
    "artichokes": {"colors": ["green", "purple", "red", "black"], "ediblePortions": ["hearts", "stems", "leaves"]},
}


def test_documentation_object_filters() -> None:
    assert ev("fruits.*.name", fruits=FRUITS) == ["apple", "orange", "pear"]
    assert ev("vegetables.*.ediblePortions", vegetables=VEGETABLES) == [
        ["roots", "stalks"],
        ["roots", "stems", "leaves"],
        ["hearts", "stems", "leaves"],
    ]
    assert ev("contains(vegetables.*.ediblePortions.*, 'stems')", vegetables=VEGETABLES) is True
    assert ev("vegetables.*.colors.*", vegetables=VEGETABLES)[:4] == ["green", "white", "red", "purple"]


def test_issue_labels_and_needs_results() -> None:
    github = {"event": {"issue": {"labels": [{"name": "bug"}, {"name": "help wanted"}]}}}
    assert ev("github.event.issue.labels.*.name", github=github) == ["bug", "help wanted"]
    needs = {"build": {"result": "success"}, "lint": {"result": "failure"}}
    assert ev("needs.*.result", needs=needs) == ["success", "failure"]
    assert ev("contains(needs.*.result, 'failure')", needs=needs) is True


@pytest.mark.parametrize(
    ("expression", "context", "value"),
    [
        ("foo.bar", {"BAR": "baz"}, "baz"),
        ("foo.BAR", {"bar": "baz"}, "baz"),
        ("foo['bAr']", {"BaR": "baz"}, "baz"),
        ("foo.b-ar", {"b-ar": "baz"}, "baz"),
        ("foo.missing", {"bar": "baz"}, None),
        ("foo[5]", {"5": "five"}, "five"),
        ("foo[0x0f]", {"15": "fifteen"}, "fifteen"),
        ("foo[null]", {"": "empty"}, "empty"),
        ("foo[true]", {"true": "yes"}, "yes"),
        ("foo[fromJSON('{}')]", {"Object": "no"}, None),
        ("foo[format('{0}', fromJSON('{}'))]", {"Object": "yes"}, "yes"),
        ("foo['*']", {"*": "star"}, "star"),
        ("foo[*]", {"one": 1, "*": 2}, [1, 2]),
        ("foo[1]", ["zero", "one"], "one"),
        ("foo['1']", ["zero", "one"], "one"),
        ("foo[' 0x01 ']", ["zero", "one"], "one"),
        ("foo[1.9]", ["zero", "one"], "one"),
        ("foo[true]", ["zero", "one"], "one"),
        ("foo[null]", ["zero", "one"], "zero"),
        ("foo[2]", ["zero", "one"], None),
        ("foo[-1]", ["zero", "one"], None),
        ("foo[NaN]", ["zero", "one"], None),
        ("foo[Infinity]", ["zero", "one"], None),
        ("foo['abc']", ["zero", "one"], None),
        ("foo.bar.baz", None, None),
        ("foo[0]", "string", None),
        ("foo.*", "string", []),
        ("foo.*", None, []),
    ],
)
def test_index(expression: str, context: Any, value: Any) -> None:
    assert ev(expression, foo=context) == value


@pytest.mark.parametrize(
    ("expression", "context", "value"),
    [
        ("foo.*.one", [{"one": 1}, {"zero": 0}, {"ONE": 3}], [1, 3]),
        ("foo[*][1]", [["a", "b"], ["c"], ["d", "e"]], ["b", "e"]),
        ("foo.*.*", [None, 1, "s", ["x", "y"], {"p": "v"}], ["x", "y", "v"]),
        ("foo.*.p.q", [{"p": {"q": 1}}, {"p": {"q": 2}}], [1, 2]),
        ("foo[*][1][2]", [[[0, 1], [0, 1, "a"]], [[0], [0, 1, "b"]]], ["a", "b"]),
        ("foo.*.bar", {}, []),
        ("foo[*][1]", [], []),
        ("foo[*][-1]", [["zero"]], []),
    ],
)
def test_filters_apply_to_each_element(expression: str, context: Any, value: Any) -> None:
    assert ev(expression, foo=context) == value


def test_filtered_array_stays_filtered_through_grouping() -> None:
    # The runner keeps the filtered-array type, so an index after a group still maps over it.
    assert ev("(foo.*)[0]", foo={"a": ["x"], "b": ["y"]}) == ["x", "y"]
    assert ev('fromJSON(\'["one", "two"]\')[1]') == "two"


def test_context_names_ignore_case() -> None:
    assert ev("GitHub.REF", github={"ref": "refs/heads/main"}) == "refs/heads/main"


def test_env_keys_are_case_sensitive() -> None:
    env = EvalEnv(contexts={"env": {"Path": "/bin", "HOME": "/root"}, "vars": {"Path": "x"}})
    assert evaluate("env.Path", env) == "/bin"
    assert evaluate("env.PATH", env) is None
    assert evaluate("env['home']", env) is None
    assert evaluate("vars.PATH", env) == "x"


def test_property_names_follow_a_dot() -> None:
    for expression in ("foo.1", "foo[1].2"):
        with pytest.raises(ExpressionError, match="Unexpected symbol"):
            ev(expression, foo={})
    with pytest.raises(ExpressionError, match=r"Unexpected symbol: 'b@r'\. Located at position 5"):
        ev("foo.b@r", foo={})
    with pytest.raises(ExpressionError, match=r"Unexpected symbol: '\('\. Located at position 8"):
        ev("github.()", github={})
