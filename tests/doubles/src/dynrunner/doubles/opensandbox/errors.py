"""The server's `{code, message}` error envelope, and the checks its service layer makes
before a runtime is touched (`services/validators.py` of opensandbox-server 1.1.1)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

RESERVED_PREFIX = "opensandbox.io/"
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ApiError(Exception):
    """An answer in the server's error envelope: HTTP status plus `{code, message}`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def _label_key_ok(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME.match(name))


def check_metadata(metadata: dict[str, str] | None) -> None:
    """Kubernetes label rules, as the server applies them to metadata (400, not 422)."""
    for key, value in (metadata or {}).items():
        if key.startswith(RESERVED_PREFIX):
            raise ApiError(
                400,
                "SANDBOX::INVALID_METADATA_LABEL",
                f"Metadata key '{key}' uses the reserved prefix '{RESERVED_PREFIX}'.",
            )
        if not _label_key_ok(key):
            raise ApiError(400, "SANDBOX::INVALID_METADATA_LABEL", f"Metadata key '{key}' is invalid.")
        if len(value) > 63 or not _VALUE.match(value):
            raise ApiError(400, "SANDBOX::INVALID_METADATA_LABEL", f"Metadata value '{value}' is invalid.")


def check_port(port: int, code: str) -> None:
    if not 1 <= port <= 65535:
        raise ApiError(400, code, "Port must be between 1 and 65535.")


def future_utc(when: datetime, now: datetime, code: str) -> datetime:
    """The renew rule: an absolute time in the future (a naive time is taken as UTC)."""
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    if when <= now:
        raise ApiError(400, code, "New expiration time must be in the future.")
    return when
