"""`ParseAuthorizationHeader` as Gitea reads the Authorization header of web requests."""

from __future__ import annotations

import base64

import pytest

from dynrunner.doubles.gitea.webauth import Credentials, parse_authorization


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"basic {_b64('x-access-token:abc')}", Credentials(basic=("x-access-token", "abc"))),
        (f"BASIC {_b64('user:pa:ss')}", Credentials(basic=("user", "pa:ss"))),
        (f"Basic {_b64('no-colon')}", Credentials()),
        ("Basic %%%", Credentials()),
        ("token abc", Credentials(bearer="abc")),
        ("Bearer a.b.c", Credentials(bearer="a.b.c")),
        ("TOKEN abc", Credentials(bearer="abc")),
        ("Bearer", Credentials()),
        ("Bearer a b", Credentials()),
        ("Digest abc", Credentials()),
    ],
)
def test_schemes_ignore_case_and_need_exactly_two_fields(header: str, expected: Credentials) -> None:
    assert parse_authorization(header) == expected
