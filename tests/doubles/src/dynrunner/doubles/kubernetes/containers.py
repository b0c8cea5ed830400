"""Turning a Pod's container spec into a local process (the kubelet's container config).

Environment: `env` in order, each value expanded with Kubernetes' `$(VAR)` rules
(third_party/forked/golang/expansion: `$(VAR)` is replaced by an earlier-defined variable,
`$$` is an escaped `$`, an unknown `$(VAR)` stays as written), `valueFrom.secretKeyRef` and
`fieldRef`, and `envFrom` Secrets (with `prefix`, `optional`). A missing Secret or key is
CreateContainerConfigError with the kubelet's message. `command` replaces the image's
entrypoint and `args` its cmd, both expanded with the container's environment.

Paths: a container path such as `/var/run/secrets/x` cannot be made on the host, so each Pod
gets a host directory and every volume is materialized under it; a `PathMap` then rewrites
every occurrence of a mount path (and the working directory) at a path boundary in the
command, args and env values to its host directory. The product never sees this: it only
writes a Pod spec, as for a real kubelet.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynrunner.doubles.kubernetes.images import Image


class ConfigError(Exception):
    """CreateContainerConfigError: the message is what the kubelet puts in `waiting.message`."""


class MountError(Exception):
    """A volume could not be set up (a FailedMount event; the Pod stays ContainerCreating)."""


_VAR = re.compile(r"\$\$|\$\(([^)]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR.sub(sub, text)


SecretLookup = Callable[[str], dict[str, Any] | None]


def _secret_data(secret: dict[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _field_ref(pod: dict[str, Any], path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIP": status.get("podIP", ""),
    }
    return str(values.get(path, ""))


def environment(pod: dict[str, Any], container: dict[str, Any], image: Image, secret: SecretLookup) -> dict[str, str]:
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = dict(image.env)
    env.setdefault("PATH", os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"))
    env["HOSTNAME"] = pod["metadata"]["name"]
    for source in container.get("envFrom") or []:
        ref = source.get("secretRef")
        if ref is None:
            continue
        found = secret(ref["name"])
        if found is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f'secret "{ref["name"]}" not found')
        for key, value in _secret_data(found).items():
            env[f"{source.get('prefix', '')}{key}"] = value.decode()
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        value_from = var["valueFrom"]
        if "secretKeyRef" in value_from:
            ref = value_from["secretKeyRef"]
            found = secret(ref["name"])
            if found is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'secret "{ref["name"]}" not found')
            data = _secret_data(found)
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise ConfigError(f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
            env[name] = data[ref["key"]].decode()
        elif "fieldRef" in value_from:
            env[name] = _field_ref(pod, value_from["fieldRef"]["fieldPath"])
    return env


def argv(container: dict[str, Any], image: Image, env: Mapping[str, str]) -> list[str]:
    command = [expand(c, env) for c in container.get("command") or []] or list(image.entrypoint)
    if container.get("command"):
        args = [expand(a, env) for a in container.get("args") or []]
    else:
        args = [expand(a, env) for a in container.get("args") or []] or list(image.cmd)
    return [*command, *args]


@dataclass
class PathMap:
    """Container path → host directory, longest prefix first."""

    mounts: dict[str, Path] = field(default_factory=dict)

    def add(self, container_path: str, host: Path) -> None:
        self.mounts[container_path.rstrip("/") or "/"] = host

    def host(self, container_path: str) -> Path | None:
        for prefix in sorted(self.mounts, key=len, reverse=True):
            if container_path == prefix or container_path.startswith(prefix + "/"):
                return Path(str(self.mounts[prefix]) + container_path[len(prefix) :])
        return None

    def rewrite(self, text: str) -> str:
        """One pass over `text`, so a replaced path is never rewritten again."""
        if not self.mounts:
            return text
        prefixes = sorted(self.mounts, key=len, reverse=True)
        alternatives = "|".join(re.escape(p) for p in prefixes)
        pattern = re.compile(r"(?<![\w.\-])(" + alternatives + r")(?=/|$|[^\w.\-])")
        return pattern.sub(lambda m: str(self.mounts[m.group(1)]), text)


def write_secret_volume(target: Path, secret: dict[str, Any], source: dict[str, Any]) -> None:
    """AtomicWriter's result for a secret volume: every key (or the `items` asked), in mode
    `defaultMode` (or the item's `mode`)."""
    data = _secret_data(secret)
    mode = int(source.get("defaultMode", 0o644))
    items = source.get("items")
    files: list[tuple[str, bytes, int]] = []
    if items:
        for item in items:
            if item["key"] not in data:
                if source.get("optional"):
                    continue
                raise MountError(f"references non-existent secret key: {item['key']}")
            files.append((item["path"], data[item["key"]], int(item.get("mode", mode))))
    else:
        files = [(key, value, mode) for key, value in data.items()]
    target.mkdir(parents=True, exist_ok=True)
    for rel, content, file_mode in files:
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(file_mode)
