"""Admission: defaulting and validation on create and update, as kube-apiserver's
registries do for the types this double serves (pkg/apis/core/validation, the pod and
secret strategies, apiextensions' structural schemas for custom resources).

Each check answers 422 `Invalid` with apimachinery's field-error wording; only the
checks a client of this double can trip are modelled.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets as pysecrets
from typing import Any

from dynrunner.doubles.kubernetes.resources import SECRETS, Resource
from dynrunner.doubles.kubernetes.status import ApiError, bad_request, invalid

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
NAME_PART_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character"
)
CONFIG_KEY_MSG = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or "
    "'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
)
# k8s.io/apiserver/pkg/storage/names: 5 characters from an alphabet without vowels.
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

Causes = list[tuple[str, str, str]]


def _value(text: Any) -> str:
    return f'Invalid value: "{text}"'


def check_name(name: str, field: str, dns_label: bool = False) -> Causes:
    if dns_label:
        if len(name) > 63:
            return [("FieldValueInvalid", field, f"{_value(name)}: must be no more than 63 characters")]
        return [] if _LABEL.match(name) else [("FieldValueInvalid", field, f"{_value(name)}: {LABEL_MSG}")]
    if len(name) > 253:
        return [("FieldValueInvalid", field, f"{_value(name)}: must be no more than 253 characters")]
    return [] if _SUBDOMAIN.match(name) else [("FieldValueInvalid", field, f"{_value(name)}: {SUBDOMAIN_MSG}")]


def assign_name(resource: Resource, obj: dict[str, Any]) -> str:
    meta = obj.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        base = meta["generateName"][: 63 - 5]
        meta["name"] = base + "".join(pysecrets.choice(_GENERATE_ALPHABET) for _ in range(5))
    if not meta.get("name"):
        raise invalid(
            resource, "", [("FieldValueRequired", "metadata.name", "Required value: name or generateName is required")]
        )
    return str(meta["name"])


def _check_meta(resource: Resource, obj: dict[str, Any]) -> Causes:
    meta = obj["metadata"]
    causes = check_name(meta["name"], "metadata.name", dns_label=resource.plural == "namespaces")
    annotations = meta.get("annotations") or {}
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > 256 * 1024:
        causes.append(("FieldValueTooLong", "metadata.annotations", "Too long: must have at most 262144 bytes"))
    for key, value in (meta.get("labels") or {}).items():
        name = key.rsplit("/", 1)[-1]
        prefix = key.rsplit("/", 1)[0] if "/" in key else ""
        if not _LABEL_NAME.match(name) or len(name) > 63 or (prefix and not _SUBDOMAIN.match(prefix)):
            causes.append(
                (
                    "FieldValueInvalid",
                    "metadata.labels",
                    f"{_value(key)}: {NAME_PART_MSG}",
                )
            )
        if not isinstance(value, str) or len(value) > 63:
            causes.append(
                ("FieldValueInvalid", "metadata.labels", f"{_value(value)}: must be no more than 63 characters")
            )
        elif not _LABEL_VALUE.match(value):
            causes.append(
                (
                    "FieldValueInvalid",
                    "metadata.labels",
                    f"{_value(value)}: {LABEL_VALUE_MSG}",
                )
            )
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for fld in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(fld):
                what = {"apiVersion": "version", "kind": "kind", "name": "name", "uid": "uid"}[fld]
                causes.append(
                    ("FieldValueInvalid", f"metadata.ownerReferences.{fld}", f"{_value('')}: {what} must not be empty")
                )
        controllers += 1 if ref.get("controller") else 0
        del i
    if controllers > 1:
        causes.append(
            (
                "FieldValueInvalid",
                "metadata.ownerReferences",
                "Invalid value: []: Only one reference can have Controller set to true",
            )
        )
    return causes


def _image_pull_policy(image: str) -> str:
    tail = image.rsplit("/", 1)[-1]
    if "@" in tail:
        return "IfNotPresent"
    tag = tail.split(":", 1)[1] if ":" in tail else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def default_pod(pod: dict[str, Any]) -> None:
    """The defaults of pkg/apis/core/v1/defaults.go and the DefaultTolerationSeconds plugin."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", _image_pull_policy(str(container.get("image", ""))))
        container.setdefault("resources", {})
        limits = container["resources"].get("limits") or {}
        if limits:
            requests = container["resources"].setdefault("requests", {})
            for name, quantity in limits.items():
                requests.setdefault(name, quantity)
    for volume in spec.get("volumes") or []:
        if "secret" in volume:
            volume["secret"].setdefault("defaultMode", 0o644)
        if "emptyDir" in volume and volume["emptyDir"] is None:
            volume["emptyDir"] = {}
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key and t.get("effect") in ("NoExecute", None, "") for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
    status = pod.setdefault("status", {})
    status.clear()
    status["phase"] = "Pending"
    status["qosClass"] = _qos(spec)


def _qos(spec: dict[str, Any]) -> str:
    containers = spec.get("containers") or []
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        set((r.get("limits") or {}).keys()) >= {"cpu", "memory"}
        and (r.get("requests") or {}) == (r.get("limits") or {})
        for r in resources
    )
    return "Guaranteed" if guaranteed else "Burstable"


def _check_pod(pod: dict[str, Any]) -> Causes:
    spec = pod.get("spec") or {}
    causes: Causes = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append(("FieldValueRequired", "spec.containers", "Required value"))
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    for i, volume in enumerate(spec.get("volumes") or []):
        sources = [k for k in volume if k != "name"]
        if len(sources) != 1:
            causes.append(
                (
                    "FieldValueRequired" if not sources else "FieldValueForbidden",
                    f"spec.volumes[{i}]",
                    "must specify exactly 1 of: ..." if sources else "Required value: must specify a volume type",
                )
            )
        causes += check_name(str(volume.get("name", "")), f"spec.volumes[{i}].name", dns_label=True)
    names: set[str] = set()
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or []):
            path = f"spec.{kind}[{i}]"
            name = container.get("name")
            if not name:
                causes.append(("FieldValueRequired", f"{path}.name", "Required value"))
            elif name in names:
                causes.append(("FieldValueDuplicate", f"{path}.name", f'Duplicate value: "{name}"'))
            else:
                causes += check_name(name, f"{path}.name", dns_label=True)
                names.add(name)
            if not container.get("image"):
                causes.append(("FieldValueRequired", f"{path}.image", "Required value"))
            for j, mount in enumerate(container.get("volumeMounts") or []):
                if mount.get("name") not in volumes:
                    causes.append(
                        ("FieldValueNotFound", f"{path}.volumeMounts[{j}].name", f'Not found: "{mount.get("name")}"')
                    )
                if not mount.get("mountPath"):
                    causes.append(("FieldValueRequired", f"{path}.volumeMounts[{j}].mountPath", "Required value"))
            for j, env in enumerate(container.get("env") or []):
                if not env.get("name"):
                    causes.append(("FieldValueRequired", f"{path}.env[{j}].name", "Required value"))
    policy = spec.get("restartPolicy")
    if policy not in ("Always", "OnFailure", "Never"):
        causes.append(
            (
                "FieldValueNotSupported",
                "spec.restartPolicy",
                f'Unsupported value: "{policy}": supported values: "Always", "Never", "OnFailure"',
            )
        )
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline <= 0):
        causes.append(
            (
                "FieldValueInvalid",
                "spec.activeDeadlineSeconds",
                f"Invalid value: {deadline}: must be between 1 and 2147483647, inclusive",
            )
        )
    return causes


def _normalize_secret(secret: dict[str, Any]) -> Causes:
    secret.setdefault("type", "Opaque")
    data = dict(secret.get("data") or {})
    for key, value in data.items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise bad_request(f"illegal base64 data at input byte 0 (key {key!r})") from exc
    for key, value in (secret.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    if data:
        secret["data"] = data
    causes: Causes = []
    for key in data:
        if not _SECRET_KEY.match(key):
            causes.append(
                (
                    "FieldValueInvalid",
                    f"data[{key}]",
                    f"{_value(key)}: {CONFIG_KEY_MSG}",
                )
            )
    if sum(len(base64.b64decode(v)) for v in data.values()) > 1024 * 1024:
        causes.append(("FieldValueTooLong", "data", "Too long: must have at most 1048576 bytes"))
    return causes


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _schema_check(value: Any, schema: dict[str, Any], path: str, causes: Causes) -> Any:
    """Structural-schema validation with pruning of unknown fields (apiextensions)."""
    kind = schema.get("type")
    if kind in ("integer", "number"):
        ok = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and (kind == "number" or float(value).is_integer())
        )
    elif kind in _TYPES:
        ok = isinstance(value, _TYPES[kind])
    else:
        ok = True
    if not ok:
        got = (
            "null"
            if value is None
            else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(type(value), "number")
        )
        causes.append(
            ("FieldValueTypeInvalid", path, f'Invalid value: "{got}": {path} in body must be of type {kind}: "{got}"')
        )
        return value
    if kind == "object":
        props = schema.get("properties")
        if props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
            value = {k: v for k, v in value.items() if k in props}
        for req in schema.get("required") or []:
            if req not in value:
                causes.append(("FieldValueRequired", f"{path}.{req}", "Required value"))
        for key, sub in (props or {}).items():
            if key in value:
                value[key] = _schema_check(value[key], sub, f"{path}.{key}", causes)
    elif kind == "array" and "items" in schema:
        value = [_schema_check(item, schema["items"], f"{path}[{i}]", causes) for i, item in enumerate(value)]
    elif kind == "string" and "enum" in schema and value not in schema["enum"]:
        causes.append(("FieldValueNotSupported", path, f'Unsupported value: "{value}"'))
    return value


def _check_custom(resource: Resource, obj: dict[str, Any]) -> Causes:
    causes: Causes = []
    if not resource.schema:
        return causes
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    checked = _schema_check(body, resource.schema, "", causes)
    for key in list(obj):
        if key not in ("apiVersion", "kind", "metadata") and key not in checked:
            del obj[key]
    obj.update(checked)
    return [(r, f.lstrip("."), m.replace(" .", " ")) for r, f, m in causes]


def _check_crd(crd: dict[str, Any]) -> Causes:
    spec = crd.get("spec") or {}
    expected = f"{(spec.get('names') or {}).get('plural', '')}.{spec.get('group', '')}"
    if crd["metadata"]["name"] != expected:
        return [
            (
                "FieldValueInvalid",
                "metadata.name",
                f'{_value(crd["metadata"]["name"])}: must be spec.names.plural+"."+spec.group',
            )
        ]
    return []


def admit(resource: Resource, obj: dict[str, Any], *, creating: bool) -> None:
    """Default and validate `obj` in place; raise 422 with every cause found."""
    causes = _check_meta(resource, obj)
    if resource.plural == "pods" and resource.group == "":
        if creating:
            default_pod(obj)
        causes += _check_pod(obj)
    elif resource.plural == "secrets":
        causes += _normalize_secret(obj)
    elif resource.plural == "namespaces":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
    elif resource.plural == "customresourcedefinitions":
        causes += _check_crd(obj)
    elif resource.custom:
        causes += _check_custom(resource, obj)
    if causes:
        raise invalid(resource, obj["metadata"]["name"], causes)


def immutable_pod_spec(old: dict[str, Any], new: dict[str, Any]) -> None:
    """A Pod's spec may only change its images, activeDeadlineSeconds and added tolerations."""

    def strip(spec: dict[str, Any]) -> dict[str, Any]:
        spec = dict(spec)
        spec.pop("activeDeadlineSeconds", None)
        spec.pop("tolerations", None)
        spec["containers"] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get("containers") or []]
        spec["initContainers"] = [
            {k: v for k, v in c.items() if k != "image"} for c in spec.get("initContainers") or []
        ]
        return spec

    if strip(old.get("spec") or {}) != strip(new.get("spec") or {}):
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{new["metadata"]["name"]}" is invalid: spec: Forbidden: '
            "pod updates may not change fields other than "
            "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
            "`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
            "(allow it to be set to 1 if it was previously negative)",
            {
                "name": new["metadata"]["name"],
                "kind": "Pod",
                "causes": [{"reason": "FieldValueForbidden", "field": "spec"}],
            },
        )


def immutable_secret(old: dict[str, Any], new: dict[str, Any]) -> None:
    """A Secret with `immutable: true` keeps its data and stays immutable (core validation)."""
    if not old.get("immutable"):
        return
    causes: Causes = []
    if new.get("data") != old.get("data"):
        causes.append(("FieldValueForbidden", "data", "Forbidden: field is immutable when `immutable` is set"))
    if not new.get("immutable"):
        causes.append(("FieldValueForbidden", "immutable", "Forbidden: field is immutable when `immutable` is set"))
    if causes:
        raise invalid(SECRETS, new["metadata"]["name"], causes)
