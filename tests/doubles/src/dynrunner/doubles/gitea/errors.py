"""Server-side failures and how each mode puts them on the wire.

Gitea's handlers return `google.golang.org/grpc/status` errors and Register returns plain Go
errors; connect-go codes both as `unknown` (HTTP 500) with the error's text, so the wire
message of a status error is ``rpc error: code = <Name> desc = <text>``. Forgejo returns
proper Connect codes. The logic raises `RpcStatus`/`PlainError`; `to_connect` shapes them.
"""

from __future__ import annotations

from connectrpc.code import Code
from connectrpc.errors import ConnectError

_CODES = {
    "Canceled": Code.CANCELED,
    "Unknown": Code.UNKNOWN,
    "InvalidArgument": Code.INVALID_ARGUMENT,
    "NotFound": Code.NOT_FOUND,
    "AlreadyExists": Code.ALREADY_EXISTS,
    "Internal": Code.INTERNAL,
    "Unavailable": Code.UNAVAILABLE,
    "Unauthenticated": Code.UNAUTHENTICATED,
}

NOT_EXIST = "resource does not exist"  # util.ErrNotExist's text


class RpcStatus(Exception):
    """`status.Error(codes.<code>, desc)` in Gitea."""

    def __init__(self, code: str, desc: str) -> None:
        super().__init__(f"rpc error: code = {code} desc = {desc}")
        self.code = code
        self.desc = desc


class PlainError(Exception):
    """A plain Go `errors.New(text)` (Register's failures); `forgejo_code` is what Forgejo sends."""

    def __init__(self, text: str, forgejo_code: str = "InvalidArgument") -> None:
        super().__init__(text)
        self.text = text
        self.forgejo_code = forgejo_code


def unauthenticated() -> RpcStatus:
    return RpcStatus("Unauthenticated", "unregistered runner")


def internal(desc: str) -> RpcStatus:
    return RpcStatus("Internal", desc)


def to_connect(err: RpcStatus | PlainError, mode: str) -> ConnectError:
    if mode == "forgejo":
        if isinstance(err, RpcStatus):
            return ConnectError(_CODES.get(err.code, Code.UNKNOWN), err.desc)
        return ConnectError(_CODES.get(err.forgejo_code, Code.UNKNOWN), err.text)
    return ConnectError(Code.UNKNOWN, str(err))
