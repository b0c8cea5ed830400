"""A job's `services:` as native sidecars of its Pod (docs/kubernetes.md, "Services"), and
what services and the job container (`job_container`) share: reading both from the workflow,
named volumes, limits, users and the per-job pull Secret.

Pure functions of the assignment and the pool's settings: the controller reads `container:`
and `services:` with the parser the executor uses (`dynrunner.proto.containers`), so both see
the same specs, and evaluates their `${{ }}` with the executor's expression language
(`pod_values`, the callback `builders.job_containers` passes). Each service becomes an init
container with `restartPolicy: Always` (a native sidecar: the kubelet starts the executor only
once every sidecar has started, i.e. passed its startup probe), reachable on `localhost` (one
network namespace per Pod) and by its name (a `hostAliases` entry to 127.0.0.1). What cannot
be built fails the job before any object exists (`ServicesError`, the message for the job log).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dynrunner.controller.backends.kubernetes import pod_values
from dynrunner.controller.backends.kubernetes.diagnosis import AGENT_INSTALL_CONTAINER, EXECUTOR_CONTAINER
from dynrunner.proto.containers import (
    SERVICES_PROVIDED_ENV,
    ContainerSpec,
    SpecError,
    Text,
    container_port,
    port_clashes,
    read_job_containers,
)

PROVIDED_ENV = SERVICES_PROVIDED_ENV
PULL_SECRET_SUFFIX = "-pull"
HOST_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_MEMORY_RE = re.compile(r"^(\d+)([bkmg]?)$")
_MEMORY_UNITS = {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}
DOCKER_HUB = "https://index.docker.io/v1/"
VOLUME_PREFIX = "vol-"
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ServicesError(ValueError):
    """The job's `services:` (or, as `JobContainerError`, its `container:`) cannot run in this
    pool; the message is for the job log, `key` names the workflow key."""

    key = "services"


class JobContainerError(ServicesError):
    key = "container"


@dataclass(frozen=True, slots=True)
class JobContainers:
    """What the job's Pod runs besides the executor: its `container:` (None without one) and
    its `services:`, in the workflow's order. An `env:` value made from a secret is a
    `pod_values.SecretText` (`pod_values.env_entries`, `secret_env`)."""

    job: ContainerSpec | None = None
    services: tuple[ContainerSpec, ...] = ()

    @property
    def all(self) -> tuple[ContainerSpec, ...]:
        return (self.job, *self.services) if self.job is not None else self.services


def job_containers(payload: bytes | None, text: Text) -> JobContainers:
    """The job container and services of the single-job workflow, their values evaluated by
    `text` (`pod_values.evaluator`; the caller, `builders.job_containers`, chooses it)."""
    if not payload or (b"services" not in payload and b"container" not in payload):
        return JobContainers()
    read = pod_values.single_job(payload)
    job = read[1] if read is not None else None
    if job is None:
        return JobContainers()  # the executor reports a workflow it cannot read
    raw_services = job.get("services") or {}
    if not isinstance(raw_services, Mapping):
        raise ServicesError("`services` must be a mapping of service names to containers")
    try:
        container, _ = read_job_containers(job.get("container"), {}, text)
    except pod_values.UnevaluableValue as err:
        raise JobContainerError(f"`container`: {err}") from None
    except SpecError as err:
        raise JobContainerError(str(err)) from None
    specs: list[ContainerSpec] = []
    for name, raw in raw_services.items():
        try:
            specs += read_job_containers(None, {name: raw}, text)[1]
        except pod_values.UnevaluableValue as err:
            raise ServicesError(f"service `{name}`: {err}") from None
        except SpecError as err:
            raise ServicesError(str(err)) from None
    problems = [problem for spec in specs if (problem := _host_name_problem(spec.name))]
    listening = {spec.name: {container_port(p).split("/")[0] for p in spec.ports} for spec in specs}
    problems += port_clashes(listening)
    problems += [problem for spec in specs for problem in _volume_problems(spec)]
    if problems:
        raise ServicesError("; ".join(problems))
    found = JobContainers(container, tuple(specs))
    logins = _login_clashes(found.all)
    if logins:
        job_involved = any(not spec.is_service for pair in logins for spec in pair)
        raise (JobContainerError if job_involved else ServicesError)(
            "; ".join(
                f"{where(first)} and {where(second)} give different `credentials` for the registry "
                f"{registry(second.image)}: a Pod pulls with one login per registry"
                for first, second in logins
            )
        )
    return found


def where(spec: ContainerSpec) -> str:
    """How the job log names a container of the workflow."""
    return f"service `{spec.name}`" if spec.is_service else "`container`"


def _host_name_problem(name: str) -> str:
    host = name.lower()
    if not HOST_NAME_RE.fullmatch(host) or host in (EXECUTOR_CONTAINER, AGENT_INSTALL_CONTAINER):
        return (
            f"service `{name}`: in Pod pools a service name is a host name and a container name: letters, "
            f"digits and '-' (not `{EXECUTOR_CONTAINER}` or `{AGENT_INSTALL_CONTAINER}`)"
        )
    return ""


def container_name(spec: ContainerSpec) -> str:
    return spec.name.lower()


def sidecars(
    specs: Sequence[ContainerSpec], pod_security: Literal["restricted", "baseline"], *, secret_name: str
) -> list[dict[str, Any]]:
    return [sidecar(spec, pod_security, secret_name=secret_name) for spec in specs]


def sidecar(
    spec: ContainerSpec, pod_security: Literal["restricted", "baseline"], *, secret_name: str
) -> dict[str, Any]:
    """One service as a native sidecar: no privilege, capabilities dropped, and under
    `restricted` `runAsNonRoot` (an image that starts as root then fails to start, naming the
    service: set `--user`, or the pool's `servicePodSecurity: baseline`). Its `env:` values
    made from secrets are read from the job's Secret (`secret_name`), never written here."""
    security = security_context(spec, pod_security)
    container: dict[str, Any] = {
        "name": container_name(spec),
        "image": spec.image,
        "restartPolicy": "Always",
        "env": pod_values.env_entries(container_name(spec), spec.env, secret_name=secret_name),
        "securityContext": security,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    ports = [port(spec, p) for p in spec.ports]
    if ports:
        container["ports"] = ports
    if spec.entrypoint:
        container["command"] = [spec.entrypoint]
    if spec.workdir:
        container["workingDir"] = spec.workdir
    resources = limits(spec)
    if resources:
        container["resources"] = {"limits": resources, "requests": dict(resources)}
    if spec.volumes:
        container["volumeMounts"] = volume_mounts(spec)
    if spec.health is not None:
        container["startupProbe"] = startup_probe(spec)
    return container


def security_context(spec: ContainerSpec, pod_security: Literal["restricted", "baseline"]) -> dict[str, Any]:
    """A job's container (service or job container): no privilege, no escalation, and under
    `restricted` `runAsNonRoot` with every capability dropped; `--user` as runAsUser/runAsGroup."""
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "runAsNonRoot": pod_security == "restricted",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if pod_security == "restricted":
        security["capabilities"] = {"drop": ["ALL"]}
    if spec.user:
        security.update(user(spec, pod_security))
    return security


def startup_probe(spec: ContainerSpec) -> dict[str, Any]:
    """`--health-cmd` as an exec probe, probed every second (a service that starts in 2 s
    does not wait for Docker's 30 s interval) for as long as Docker would give it:
    start period + interval × retries, at least one attempt."""
    health = spec.health
    assert health is not None
    budget = health.start_period_s + health.interval_s * max(health.retries, 1)
    return {
        "exec": {"command": ["/bin/sh", "-c", health.command]},
        "periodSeconds": 1,
        "timeoutSeconds": max(1, math.ceil(health.timeout_s)),
        "failureThreshold": max(1, math.ceil(budget)),
    }


def _error(spec: ContainerSpec) -> type[ServicesError]:
    return ServicesError if spec.is_service else JobContainerError


def user(spec: ContainerSpec, pod_security: Literal["restricted", "baseline"]) -> dict[str, int]:
    """`--user uid[:gid]` as `runAsUser`/`runAsGroup`."""
    uid, _, group = spec.user.partition(":")
    if not uid.isdigit() or (group and not group.isdigit()):
        raise _error(spec)(
            f"{where(spec)}: `--user {spec.user}`: in Pod pools a user is numeric, uid[:gid] "
            "(Kubernetes cannot look names up in the image)"
        )
    if int(uid) == 0 and pod_security == "restricted":
        raise _error(spec)(
            f"{where(spec)}: `--user {spec.user}` is root, which this pool (`servicePodSecurity: restricted`) "
            "does not run: use another uid, or a pool with `servicePodSecurity: baseline`"
        )
    found = {"runAsUser": int(uid)}
    if group:
        found["runAsGroup"] = int(group)
    return found


def port(spec: ContainerSpec, value: str) -> dict[str, Any]:
    """A `ports:` entry as a `containerPort` (nothing is published: the Pod shares one network)."""
    number, _, protocol = container_port(value).partition("/")
    if not number.isdigit() or not 0 < int(number) < 65536:
        raise _error(spec)(f"{where(spec)}: port {value!r} is not a port number")
    return {"containerPort": int(number), "protocol": (protocol or "tcp").upper()}


def limits(spec: ContainerSpec) -> dict[str, str]:
    """`--cpus` and `--memory` as resource limits (`0.5` → `500m`, `512m` → `512Mi`)."""
    found = {}
    if spec.cpus:
        try:
            cpus = float(spec.cpus)
        except ValueError:
            cpus = -1.0
        if cpus <= 0:
            raise _error(spec)(f"{where(spec)}: `--cpus {spec.cpus}`: expected a positive number")
        found["cpu"] = f"{max(1, round(cpus * 1000))}m"
    if spec.memory:
        match = _MEMORY_RE.fullmatch(spec.memory.strip().lower())
        if match is None:
            raise _error(spec)(f"{where(spec)}: `--memory {spec.memory}`: expected a size such as 512m or 2g")
        found["memory"] = match.group(1) + _MEMORY_UNITS[match.group(2)]
    return found


def _volume_parts(volume: str) -> tuple[str, str, bool]:
    """`name:/path[:ro|:rw]` → (name, path, read only); the parser checked name and path."""
    name, _, target = volume.partition(":")
    path, _, mode = target.partition(":")
    return name, path.rstrip("/") or "/", mode == "ro"


def _volume_problems(spec: ContainerSpec) -> list[str]:
    problems, paths = [], set()
    for volume in spec.volumes:
        _, path, _ = _volume_parts(volume)
        mode = volume.split(":", 2)[2] if volume.count(":") >= 2 else ""
        if mode not in ("", "ro", "rw"):
            problems.append(f"{where(spec)}: volume {volume!r}: in Pod pools a mode is `ro` or `rw`")
        if path in paths:
            problems.append(f"{where(spec)}: two volumes are mounted at {path}")
        paths.add(path)
    return problems


def pod_volume_name(name: str) -> str:
    """The Pod's volume for a named volume: a DNS label, the same for every container that
    names it, distinct for distinct names (a digest when the name had to be changed)."""
    plain = name.lower()
    if name == plain and _DNS_LABEL_RE.fullmatch(plain) and len(plain) <= 50:
        return VOLUME_PREFIX + plain
    label = re.sub(r"[^a-z0-9-]+", "-", plain).strip("-")[:40].strip("-")
    return f"{VOLUME_PREFIX}{label}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def volume_mounts(spec: ContainerSpec) -> list[dict[str, Any]]:
    """A container's named volumes (`name:/path[:ro]`), mounted from the Pod's `emptyDir`s."""
    mounts = []
    for volume in spec.volumes:
        name, path, read_only = _volume_parts(volume)
        mount: dict[str, Any] = {"name": pod_volume_name(name), "mountPath": path}
        if read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    return mounts


def named_volumes(specs: Sequence[ContainerSpec]) -> list[dict[str, Any]]:
    """One `emptyDir` per volume name of the job's containers: shared by every container
    that names it, deleted with the Pod (Docker's named volumes outlive a job; a Pod's cannot)."""
    names = dict.fromkeys(pod_volume_name(_volume_parts(v)[0]) for spec in specs for v in spec.volumes)
    return [{"name": name, "emptyDir": {}} for name in names]


def secret_env(specs: Sequence[ContainerSpec]) -> dict[str, str]:
    """The `env:` values made from secrets of the job's containers (the job container's and
    the services'): data for the job's Secret."""
    return pod_values.secret_env((container_name(spec), spec.env) for spec in specs)


def host_aliases(specs: Sequence[ContainerSpec]) -> list[dict[str, Any]]:
    """Every service by its name on 127.0.0.1: the Pod's containers share its network."""
    if not specs:
        return []
    return [{"ip": "127.0.0.1", "hostnames": [container_name(spec) for spec in specs]}]


def registry(image: str) -> str:
    """The registry an image reference names (Docker Hub for `redis`, `library/x`, `user/x`)."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def _login_clashes(specs: Sequence[ContainerSpec]) -> list[tuple[ContainerSpec, ContainerSpec]]:
    """One pull Secret holds one login per registry: two containers of the job that log in
    to one registry differently cannot both be pulled with it."""
    seen: dict[str, ContainerSpec] = {}
    clashes = []
    for spec in specs:
        if spec.credentials is None:
            continue
        first = seen.setdefault(registry(spec.image), spec)
        if first.credentials != spec.credentials:
            clashes.append((first, spec))
    return clashes


def pull_secret(
    specs: Sequence[ContainerSpec], *, name: str, namespace: str, labels: Mapping[str, str]
) -> dict[str, Any] | None:
    """The `credentials` of the job's containers (the job container's and the services') as
    one `kubernetes.io/dockerconfigjson` Secret (None when none has any); it is owned by the
    Pod, so deleted with it."""
    auths: dict[str, dict[str, str]] = {}
    for spec in specs:
        if spec.credentials is None:
            continue
        username, password = spec.credentials
        token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        auths[registry(spec.image)] = {"username": username, "password": password, "auth": token}
    if not auths:
        return None
    config = json.dumps({"auths": auths}, sort_keys=True).encode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name + PULL_SECRET_SUFFIX, "namespace": namespace, "labels": dict(labels)},
        "type": "kubernetes.io/dockerconfigjson",
        "immutable": True,
        "data": {".dockerconfigjson": base64.b64encode(config).decode("ascii")},
    }
