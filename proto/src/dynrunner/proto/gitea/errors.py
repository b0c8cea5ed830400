"""Errors from Gitea's RunnerService, typed by what they mean.

Gitea's handlers return gRPC status errors that connect-go does not recognise, so on the
wire every failure arrives as Connect code ``unknown`` with a message such as
``rpc error: code = Unauthenticated desc = unregistered runner``. Forgejo (and a proxy)
answer with proper Connect codes. `from_connect` reads both shapes into one hierarchy.

Hierarchy::

    GiteaError                     .code (gRPC-style name), .message, .transient
    ├── Unauthenticated            unknown/revoked runner credentials
    ├── InvalidArgument
    ├── NotFound
    ├── AlreadyExists              e.g. "log file has been archived"
    ├── Unimplemented              the server lacks the RPC (Gitea too old)
    ├── Internal                   server-side failure; transient unless the text says otherwise
    │   ├── RunnerRemoved          an ephemeral runner whose task finished ("runner has been removed")
    │   └── ErrorPage              an HTTP 500 without a Connect body: a front end replaced Gitea's answer
    ├── RegistrationRefused        Register refused the registration token (unknown, invalidated, owner gone)
    ├── Unavailable                network errors, timeouts, 502/503/504 (always transient)
    └── RequestTooLarge            a front end refused the body as too large (HTTP 413)
"""

from __future__ import annotations

import re
from http import HTTPStatus

from connectrpc.code import Code
from connectrpc.errors import ConnectError

_GRPC_TEXT = re.compile(r"^rpc error: code = (?P<code>\w+) desc = (?P<desc>.*)$", re.S)

# gRPC status names as Gitea writes them, mapped to our classes' code names.
_GRPC_NAMES = {
    "Canceled": "Canceled",
    "Unknown": "Unknown",
    "InvalidArgument": "InvalidArgument",
    "DeadlineExceeded": "DeadlineExceeded",
    "NotFound": "NotFound",
    "AlreadyExists": "AlreadyExists",
    "PermissionDenied": "PermissionDenied",
    "ResourceExhausted": "ResourceExhausted",
    "FailedPrecondition": "FailedPrecondition",
    "Aborted": "Aborted",
    "OutOfRange": "OutOfRange",
    "Unimplemented": "Unimplemented",
    "Internal": "Internal",
    "Unavailable": "Unavailable",
    "DataLoss": "DataLoss",
    "Unauthenticated": "Unauthenticated",
}

_CONNECT_TO_NAME = {
    Code.CANCELED: "Canceled",
    Code.UNKNOWN: "Unknown",
    Code.INVALID_ARGUMENT: "InvalidArgument",
    Code.DEADLINE_EXCEEDED: "DeadlineExceeded",
    Code.NOT_FOUND: "NotFound",
    Code.ALREADY_EXISTS: "AlreadyExists",
    Code.PERMISSION_DENIED: "PermissionDenied",
    Code.RESOURCE_EXHAUSTED: "ResourceExhausted",
    Code.FAILED_PRECONDITION: "FailedPrecondition",
    Code.ABORTED: "Aborted",
    Code.OUT_OF_RANGE: "OutOfRange",
    Code.UNIMPLEMENTED: "Unimplemented",
    Code.INTERNAL: "Internal",
    Code.UNAVAILABLE: "Unavailable",
    Code.DATA_LOSS: "DataLoss",
    Code.UNAUTHENTICATED: "Unauthenticated",
}

_BARE_500 = HTTPStatus.INTERNAL_SERVER_ERROR.phrase
"""What the Connect client makes of an HTTP 500 without a Connect error body."""
_BARE_413 = HTTPStatus.REQUEST_ENTITY_TOO_LARGE.phrase
_TRANSIENT_CODES = {"Unavailable", "DeadlineExceeded", "ResourceExhausted", "Aborted", "Canceled"}
# Register's answers to a registration token it will not take (Gitea's routers/api/actions/runner/
# runner.go, the same from 1.24 to main); no other call says "registration token" or "of the token".
_TOKEN_REFUSED = (
    "runner registration token not found",
    "runner registration token has been invalidated",
    "owner of the token not found",
    "repository of the token not found",
)
# Internal errors whose text shows they will never succeed on retry.
_PERMANENT_INTERNAL = ("invalid runner for task", "runner has been removed", "task with id", "resource does not exist")


class GiteaError(Exception):
    """A failed RunnerService call. `code` is the gRPC-style status name."""

    code: str = "Unknown"

    def __init__(self, message: str, *, code: str | None = None, wire: str = "") -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.wire = wire or message

    @property
    def transient(self) -> bool:
        """Worth retrying the same call later."""
        return self.code in _TRANSIENT_CODES

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class Unauthenticated(GiteaError):
    code = "Unauthenticated"


class InvalidArgument(GiteaError):
    code = "InvalidArgument"


class NotFound(GiteaError):
    code = "NotFound"


class AlreadyExists(GiteaError):
    code = "AlreadyExists"


class Unimplemented(GiteaError):
    code = "Unimplemented"


class Internal(GiteaError):
    code = "Internal"

    @property
    def transient(self) -> bool:
        return not any(marker in self.message for marker in _PERMANENT_INTERNAL)


class RunnerRemoved(Internal):
    """An ephemeral runner asked for a second task; Gitea deleted it."""

    @property
    def transient(self) -> bool:
        return False


class ErrorPage(Internal):
    """An HTTP 500 whose body is no Connect error. Gitea answers every failure as a 500 with a
    Connect body, so this is a front end (nginx's `proxy_intercept_errors`, a CDN's error
    pages) that replaced Gitea's body with its own page — hiding what Gitea said, which may
    have been "unregistered runner" as well as a passing failure — or Gitea's own page after a
    panic. Transient, since one cannot tell; callers that see it repeat for one runner ask
    Gitea another way (`Registrations.confirm`)."""

    @property
    def transient(self) -> bool:
        return True


class RegistrationRefused(GiteaError):
    """Register refused the registration token: Gitea does not know it, a newer token of its
    scope replaced it, or the token's owner or repository is gone. The same token never
    succeeds later; `code` is whatever the server sent (Gitea: Unknown)."""


class Unavailable(GiteaError):
    code = "Unavailable"

    @property
    def transient(self) -> bool:
        return True


class RequestTooLarge(GiteaError):
    """A front end before Gitea refused the request's body as too large (HTTP 413; nginx's
    `client_max_body_size` is 1 MiB by default). Gitea never saw it; the same request never
    passes, a smaller one may."""

    code = "RequestTooLarge"


_CLASSES: dict[str, type[GiteaError]] = {
    "Unauthenticated": Unauthenticated,
    "InvalidArgument": InvalidArgument,
    "NotFound": NotFound,
    "AlreadyExists": AlreadyExists,
    "Unimplemented": Unimplemented,
    "Internal": Internal,
    "Unavailable": Unavailable,
    "DeadlineExceeded": Unavailable,
}


def classify(code: str, message: str, wire: str = "") -> GiteaError:
    """Build the typed error for a gRPC-style `code` name and its description."""
    if code == "Internal" and "runner has been removed" in message:
        return RunnerRemoved(message, wire=wire)
    if any(refusal in message for refusal in _TOKEN_REFUSED):
        return RegistrationRefused(message, code=code, wire=wire)
    cls = _CLASSES.get(code, GiteaError)
    return cls(message, code=code, wire=wire)


def from_connect(err: ConnectError) -> GiteaError:
    """Read a ConnectError in either shape: Gitea's ``unknown`` + gRPC text, or a proper code.

    An HTTP 500 whose body is no Connect error (a reverse proxy's page, or Gitea's own after a
    panic) reaches us as ``unknown`` with the bare status phrase: it is read as a transient
    Internal error, like the 502/503/504 the Connect protocol already maps to Unavailable.
    Gitea's own errors always carry a Connect body, so they never look like that."""
    if err.code is Code.UNKNOWN and err.message == _BARE_500 and not err.details:
        return ErrorPage("HTTP 500 without a Connect error (an error page)", wire=err.message)
    if err.code is Code.UNKNOWN and err.message == _BARE_413 and not err.details:
        return RequestTooLarge("HTTP 413: a proxy in front of Gitea refused the request as too large", wire=err.message)
    if err.code is Code.UNKNOWN:
        match = _GRPC_TEXT.match(err.message)
        if match:
            code = _GRPC_NAMES.get(match["code"], "Unknown")
            return classify(code, match["desc"], wire=err.message)
        # Register returns plain Go errors: "unknown" with the bare text.
        return classify("Unknown", err.message, wire=err.message)
    return classify(_CONNECT_TO_NAME.get(err.code, "Unknown"), err.message, wire=err.message)
