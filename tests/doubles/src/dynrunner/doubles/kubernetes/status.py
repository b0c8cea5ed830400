"""`Status` errors with kube-apiserver's bodies (k8s.io/apimachinery/pkg/api/errors).

Each constructor reproduces the message, reason, details and code that apimachinery's
`NewNotFound`, `NewAlreadyExists`, `NewConflict`, `NewInvalid`, ... produce, because
clients branch on `reason` and `code` and users read `message`.
"""

from __future__ import annotations

from typing import Any

from dynrunner.doubles.kubernetes.resources import Resource


class ApiError(Exception):
    """An error answered as a `Status` object with its HTTP code."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(resource: Resource, name: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.plural
    details.update(extra)
    return details


def not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource.group_resource} "{name}" not found', _details(resource, name))


def already_exists(resource: Resource, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{resource.group_resource} "{name}" already exists', _details(resource, name)
    )


def conflict(resource: Resource, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {resource.group_resource} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(resource, name))


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(resource: Resource, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 from field errors: (reason, field, message) with apimachinery's `FieldValue*` reasons."""
    joined = ", ".join(f"{fld}: {msg}" for _, fld, msg in causes)
    if len(causes) > 1:
        joined = f"[{joined}]"
    kind = resource.kind
    details: dict[str, Any] = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = kind
    details["causes"] = [{"reason": r, "message": m, "field": f} for r, f, m in causes]
    return ApiError(
        422, "Invalid", f'{kind}{"." + resource.group if resource.group else ""} "{name}" is invalid: {joined}', details
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(resource_text: str, name: str, message: str, group: str = "", kind: str = "") -> ApiError:
    details: dict[str, Any] = {"kind": kind}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    prefix = f'{resource_text} "{name}"' if name else resource_text
    return ApiError(403, "Forbidden", f"{prefix} is forbidden: {message}", details)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def method_not_supported(resource: Resource, verb: str) -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        f"{verb} is not supported on resources of kind {resource.group_resource!r}",
        {"kind": resource.plural, "group": resource.group} if resource.group else {"kind": resource.plural},
    )


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: {content_type}",
    )


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}", {"causes": [{"message": message}]})


def too_old(requested: int, oldest: int) -> ApiError:
    """What a watch from a compacted resourceVersion receives (an ERROR event, code 410)."""
    return ApiError(410, "Expired", f"too old resource version: {requested} ({oldest})")


def not_found_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})
