"""Both error shapes read into the same typed errors: Gitea's `unknown` + gRPC text, and
proper Connect codes (Forgejo, proxies)."""

from __future__ import annotations

from http import HTTPStatus

import pytest
from connectrpc.code import Code
from connectrpc.errors import ConnectError

from dynrunner.proto.gitea import errors as e


@pytest.mark.parametrize(
    ("message", "cls", "code", "desc", "transient"),
    [
        (
            "rpc error: code = Unauthenticated desc = unregistered runner",
            e.Unauthenticated,
            "Unauthenticated",
            "unregistered runner",
            False,
        ),
        (
            "rpc error: code = Internal desc = pick task: runner has been removed",
            e.RunnerRemoved,
            "Internal",
            "pick task: runner has been removed",
            False,
        ),
        (
            "rpc error: code = Internal desc = invalid runner for task",
            e.Internal,
            "Internal",
            "invalid runner for task",
            False,
        ),
        (
            "rpc error: code = Internal desc = pick task: CreateTaskForRunner: database is locked",
            e.Internal,
            "Internal",
            "pick task: CreateTaskForRunner: database is locked",
            True,
        ),
        (
            "rpc error: code = AlreadyExists desc = log file has been archived",
            e.AlreadyExists,
            "AlreadyExists",
            "log file has been archived",
            False,
        ),
        ("rpc error: code = NotFound desc = task 7 not found", e.NotFound, "NotFound", "task 7 not found", False),
        ("rpc error: code = Unavailable desc = shutting down", e.Unavailable, "Unavailable", "shutting down", True),
    ],
)
def test_gitea_shape(message: str, cls: type[e.GiteaError], code: str, desc: str, transient: bool):
    err = e.from_connect(ConnectError(Code.UNKNOWN, message))
    assert type(err) is cls
    assert (err.code, err.message, err.transient, err.wire) == (code, desc, transient, message)


@pytest.mark.parametrize(
    "message",
    [
        "runner registration token not found",
        "runner registration token has been invalidated, please use the latest one",
        "owner of the token not found",
        "repository of the token not found",
    ],
)
@pytest.mark.parametrize("code", [Code.UNKNOWN, Code.INVALID_ARGUMENT])  # Gitea's plain error; Forgejo's code
def test_a_refused_registration_token_is_its_own_permanent_error(message: str, code: Code):
    err = e.from_connect(ConnectError(code, message))
    assert type(err) is e.RegistrationRefused
    assert (err.message, err.transient) == (message, False)


def test_other_register_plain_errors_are_unknown_and_permanent():
    err = e.from_connect(ConnectError(Code.UNKNOWN, "can't create new runner"))
    assert type(err) is e.GiteaError
    assert (err.code, err.message, err.transient) == ("Unknown", "can't create new runner", False)


@pytest.mark.parametrize(
    ("code", "cls", "transient"),
    [
        (Code.UNAUTHENTICATED, e.Unauthenticated, False),
        (Code.ALREADY_EXISTS, e.AlreadyExists, False),
        (Code.UNIMPLEMENTED, e.Unimplemented, False),
        (Code.UNAVAILABLE, e.Unavailable, True),
        (Code.DEADLINE_EXCEEDED, e.Unavailable, True),
        (Code.INTERNAL, e.Internal, True),
        (Code.RESOURCE_EXHAUSTED, e.GiteaError, True),
        (Code.PERMISSION_DENIED, e.GiteaError, False),
    ],
)
def test_proper_connect_codes(code: Code, cls: type[e.GiteaError], transient: bool):
    err = e.from_connect(ConnectError(code, "unregistered runner"))
    assert type(err) is cls
    assert err.transient is transient
    assert err.message == "unregistered runner"


def test_forgejo_runner_removed_has_same_type_as_gitea():
    gitea = e.from_connect(
        ConnectError(Code.UNKNOWN, "rpc error: code = Internal desc = pick task: runner has been removed")
    )
    forgejo = e.from_connect(ConnectError(Code.INTERNAL, "pick task: runner has been removed"))
    assert type(gitea) is type(forgejo) is e.RunnerRemoved


def test_str_names_code_and_message():
    err = e.from_connect(ConnectError(Code.UNKNOWN, "rpc error: code = Unauthenticated desc = unregistered runner"))
    assert str(err) == "Unauthenticated: unregistered runner"


def test_a_bare_http_500_is_a_transient_internal_error():
    """A proxy's (or Gitea's panic) 500 page has no Connect body: the client sees `unknown` with
    the status phrase. DESIGN §7: 5xx is retried."""
    err = e.from_connect(ConnectError(Code.UNKNOWN, "Internal Server Error"))
    assert type(err) is e.ErrorPage and isinstance(err, e.Internal) and err.transient
    assert err.wire == "Internal Server Error"
    # Gitea's own errors keep their meaning.
    assert not e.from_connect(ConnectError(Code.UNKNOWN, "runner registration token not found")).transient


def test_a_bare_http_413_is_a_request_too_large_for_good():
    """A front end's "body too large" page (nginx: client_max_body_size): the same request
    never passes, so it is not retried; the reporter makes its requests smaller instead."""
    err = e.from_connect(ConnectError(Code.UNKNOWN, HTTPStatus.REQUEST_ENTITY_TOO_LARGE.phrase))
    assert type(err) is e.RequestTooLarge and not err.transient
