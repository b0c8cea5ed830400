"""Built-in functions: examples from GitHub's documentation ("Functions") and the runner's edge cases."""

from __future__ import annotations

import math

import pytest

from dynrunner.proto.expressions import EvalEnv, ExpressionError, evaluate, evaluate_if
from tests.fixtures.expressions import ev


def test_documentation_examples() -> None:
    labels = {"event": {"issue": {"labels": [{"name": "bug"}, {"name": "help wanted"}]}}, "event_name": "push"}
    assert ev("contains('Hello world', 'llo')") is True
    assert ev("contains(github.event.issue.labels.*.name, 'bug')", github=labels) is True
    assert ev('contains(fromJSON(\'["push", "pull_request"]\'), github.event_name)', github=labels) is True
    assert ev("startsWith('Hello world', 'He')") is True
    assert ev("endsWith('Hello world', 'ld')") is True
    assert ev("format('Hello {0} {1} {2}', 'Mona', 'the', 'Octocat')") == "Hello Mona the Octocat"
    assert ev("format('{{Hello {0} {1} {2}!}}', 'Mona', 'the', 'Octocat')") == "{Hello Mona the Octocat!}"
    assert ev("join(github.event.issue.labels.*.name, ', ')", github=labels) == "bug, help wanted"
    assert ev("toJSON(job)", job={"status": "success"}) == '{\n  "status": "success"\n}'
    assert ev("fromJSON(env.continue)", env={"continue": "true"}) is True
    assert ev("fromJSON(env.time)", env={"time": "3"}) == 3


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("contains('abc', 'B')", True),
        ("contains('abc', '')", True),
        ("contains('abc', 'd')", False),
        ("contains(123, 2)", True),
        ("contains(true, 'ru')", True),
        ("contains(null, '')", True),
        ("contains('abc', fromJSON('[]'))", False),
        ("contains(fromJSON('[1, \"two\", null]'), '1')", True),
        ("contains(fromJSON('[1, \"two\", null]'), 'TWO')", True),
        ("contains(fromJSON('[1, \"two\", null]'), 0)", True),  # null == 0 under loose equality
        ("contains(fromJSON('[]'), 'x')", False),
        ("contains(fromJSON('{\"a\": 1}'), 'a')", False),
        ("startsWith('ABC', 'ab')", True),
        ("startsWith('abc', fromJSON('{}'))", False),
        ("startsWith(fromJSON('[]'), '')", False),
        ("endsWith(1.5, '.5')", True),
        ("endsWith('asdf_ı', 'I')", False),
    ],
)
def test_string_and_array_tests(expression: str, value: bool) -> None:
    assert ev(expression) is value


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("format(null)", ""),
        ("format('123{0}456{0}789', 'abc')", "123abc456abc789"),
        ("format('{{0}}', 'abc')", "{0}"),
        ("format('{{{{0}}}}', 'abc')", "{{0}}"),
        ("format('}}{{', 'abc')", "}{"),
        ("format('{0}{1}', null, true)", "true"),
        ("format('{0}', fromJSON('[]'))", "Array"),
        ("format('{0}', fromJSON('{}'))", "Object"),
        ("format('{00}', 'x')", "x"),
        ("format('{1}', 'a', 'b')", "b"),
    ],
)
def test_format(expression: str, value: str) -> None:
    assert ev(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("format('{0')", "The following format string is invalid: {0"),
        ("format('{0}}', '')", "The following format string is invalid: {0}}"),
        ("format('0}')", "The following format string is invalid: 0}"),
        ("format('}{0}', '')", "The following format string is invalid: }{0}"),
        ("format('{0}{', '')", "The following format string is invalid: {0}{"),
        ("format('{a}', '')", "The following format string is invalid: {a}"),
        ("format('{256}', '')", "The following format string is invalid: {256}"),
        ("format('{0}')", "The following format string references more arguments than were supplied: {0}"),
        ("format('{0}{1}', 'abc')", "The following format string references more arguments than were supplied: {0}{1}"),
        ("format('{0:x}', 'abc')", "The format specifiers 'x' are not valid for objects of type 'String'"),
    ],
)
def test_format_errors(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        ev(expression)
    assert str(caught.value) == message


def test_format_string_errors_come_before_arguments_are_evaluated() -> None:
    with pytest.raises(ExpressionError, match="format string is invalid"):
        ev("format('{', fromJSON(''))")


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("join(null)", ""),
        ("join(true)", "true"),
        ("join(123.456)", "123.456"),
        ("join('abc')", "abc"),
        ("join(fromJSON('[]'))", ""),
        ("join(fromJSON('{\"a\": 1}'))", ""),
        ("join(fromJSON('[null, true, 1.5, \"a\", [], {}]'))", ",true,1.5,a,Array,Object"),
        ('join(fromJSON(\'["a", "b"]\'), null)', "ab"),
        ('join(fromJSON(\'["a", "b"]\'), 1)', "a1b"),
        ("join(fromJSON('[\"a\", \"b\"]'), fromJSON('[]'))", "a,b"),
        ("join(fromJSON('[\"only\"]'), fromJSON(''))", "only"),  # separator unused for one item
    ],
)
def test_join(expression: str, value: str) -> None:
    assert ev(expression) == value


def test_to_json() -> None:
    assert ev("toJSON(null)") == "null"
    assert ev("toJSON(-0)") == "0"
    assert ev("toJSON(1234.5)") == "1234.5"
    assert ev("toJSON('a\"b\\c')") == '"a\\"b\\\\c"'
    assert ev("toJSON(x)", x=[]) == "[]"
    assert ev("toJSON(x)", x={}) == "{}"
    nested = [[1, 2], ["abc"], [True, False, None, [], {}]]
    assert ev("toJSON(x)", x=nested) == (
        '[\n  [\n    1,\n    2\n  ],\n  [\n    "abc"\n  ],\n'
        "  [\n    true,\n    false,\n    null,\n    [],\n    {}\n  ]\n]"
    )
    assert ev("toJSON(x)", x={"k": "line\nbreak\ttab\u0001\u2028"}) == (
        '{\n  "k": "line\\nbreak\\ttab\\u0001\\u2028"\n}'
    )
    assert ev("toJSON(x)", x={"n": 1e20, "nan": math.nan}) == '{\n  "n": 1E+20,\n  "nan": NaN\n}'


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("null", None),
        ("true", True),
        ("-0", 0),
        ("-1234.5", -1234.5),
        ('"abc\'def"', "abc'def"),
        ('"\\u0041\\n"', "A\n"),
        ("[1, 2, [true, {}]]", [1, 2, [True, {}]]),
        ('{"a": {"b": [1]}}', {"a": {"b": [1]}}),
        ("{'single': 'quotes', unquoted: 1}", {"single": "quotes", "unquoted": 1}),
        ("[1, 2,]", [1, 2]),
        ("[1,,2]", [1, "", 2]),
        ("/* comment */ [1, // line\n 2]", [1, 2]),
        ("0x1F", 31),
        ("010", 8),
        ("1e3", 1000),
        ('{"a": 1} trailing text is ignored', {"a": 1}),
        ('{"Key": 1, "key": 2}', {"Key": 2}),  # a case-insensitive object keeps the first spelling
    ],
)
def test_from_json(text: str, value: object) -> None:
    assert ev("fromJSON(x)", x=text) == value


def test_from_json_special_numbers() -> None:
    assert math.isnan(ev("fromJSON('NaN')"))
    assert ev("fromJSON('-Infinity')") == -math.inf


def test_from_json_objects_are_case_insensitive() -> None:
    assert ev('fromJSON(\'{"Name": "x"}\').NAME') == "x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Error reading JToken from JsonReader. Path '', line 0, position 0."),
        ("   ", "Error reading JToken from JsonReader."),
        ("{", "Unexpected end when reading JSON."),
        ('{"a" 1}', "Invalid character after parsing property name. Expected ':' but got: 1."),
        ("[1 2]", "After parsing a value an unexpected character was encountered: 2."),
        ("tru", "Error parsing boolean value."),
        ("1z", "Unexpected character encountered while parsing number: z."),
        ("1x", "Input string '1x' is not a valid number."),
        ("09", "Input string '09' is not a valid number."),
        ('"abc', 'Unterminated string. Expected delimiter: ".'),
        ('"\\q"', "Bad JSON escape sequence: \\q."),
        ("@", "Unexpected character encountered while parsing value: @."),
        ("[" * 65 + "]" * 65, "The reader's MaxDepth of 64 has been exceeded."),
    ],
)
def test_from_json_errors(text: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        ev("fromJSON(x)", x=text)
    assert str(caught.value).startswith(message)


def test_from_json_error_names_the_path() -> None:
    with pytest.raises(ExpressionError, match=r"Path 'a\.b\[1\]', line 2, position"):
        ev("fromJSON(x)", x='{"a": {"b": [1,\n @]}}')


def test_from_json_of_nested_depth_64_is_fine() -> None:
    assert ev("fromJSON(x)", x="[" * 64 + "]" * 64) is not None


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("case(true, 'first', 'default')", "first"),
        ("case(false, 'first', 'default')", "default"),
        ("case(false, 'a', true, 'b', 'c')", "b"),
        ("case(1 == 2, 'equal', 'not equal')", "not equal"),
        ("case(true, fromJSON('[1]'), 'x')", [1]),
        ("case(false, 0, 1)", 1),
    ],
)
def test_case(expression: str, value: object) -> None:
    assert ev(expression) == value


def test_case_errors() -> None:
    with pytest.raises(ExpressionError, match=r"^case predicate must evaluate to a boolean value$"):
        ev("case('yes', 'a', 'b')")
    with pytest.raises(
        ExpressionError,
        match=r"^Even number of parameters supplied, requires an odd number of parameters: 'case'\. Located at pos",
    ):
        ev("case(true, 'first', false, 'second')")


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("join()", "Too few parameters supplied: 'join'. Located at position 1 within expression: join()"),
        ("join(1, 2, 3)", "Too many parameters supplied: 'join'. Located at position 1"),
        ("contains('a')", "Too few parameters supplied: 'contains'"),
        ("toJSON(1, 2)", "Too many parameters supplied: 'toJSON'"),
        ("1 == nosuch()", "Unrecognized function: 'nosuch'. Located at position 6 within expression: 1 == nosuch()"),
        ("success(1)", "Too many parameters supplied: 'success'"),
    ],
)
def test_arity_and_unknown_functions(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        ev(expression)
    assert str(caught.value).startswith(message)


def test_function_names_ignore_case() -> None:
    assert ev("TOJSON(1)") == "1"
    assert ev("ConTains('abc', 'B')") is True


@pytest.mark.parametrize(
    ("status", "success", "failure", "cancelled"),
    [("success", True, False, False), ("failure", False, True, False), ("cancelled", False, False, True)],
)
def test_status_functions_answer_from_the_job_status(
    status: str, success: bool, failure: bool, cancelled: bool
) -> None:
    env = EvalEnv(job_status=status)
    assert evaluate("success()", env) is success
    assert evaluate("failure()", env) is failure
    assert evaluate("cancelled()", env) is cancelled
    assert evaluate("always()", env) is True
    assert evaluate_if("always()", env) is True


def test_unknown_job_status_is_refused() -> None:
    with pytest.raises(ExpressionError, match="Unknown job status 'skipped'"):
        evaluate("1", EvalEnv(job_status="skipped"))
