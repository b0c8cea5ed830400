"""A job's `services:` as native sidecars of its Pod (docs/kubernetes.md, "Services").

Pure functions of the assignment and the pool's settings: the controller reads `services:`
with the parser the executor uses (`dynrunner.proto.containers`), so both see the same specs,
and evaluates their `${{ }}` with the executor's expression language (`pod_values`). Each
service becomes an init container with `restartPolicy: Always` (a native sidecar: the kubelet
starts the executor only once every sidecar has started, i.e. passed its startup probe),
reachable on `localhost` (one network namespace per Pod) and by its name (a `hostAliases`
entry to 127.0.0.1). What cannot be built fails the job before any object exists
(`ServicesError`, the message for the job log).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from dynrunner.controller.backends.kubernetes import pod_values
from dynrunner.controller.backends.kubernetes.diagnosis import EXECUTOR_CONTAINER
from dynrunner.proto.assignment import Assignment
from dynrunner.proto.containers import (
    SERVICES_PROVIDED_ENV,
    ContainerSpec,
    SpecError,
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


class ServicesError(ValueError):
    """The job's `services:` cannot run in this pool; the message is for the job log."""


def job_services(assignment: Assignment) -> list[ContainerSpec]:
    """The services of the job's single-job workflow, in order, their `${{ }}` evaluated
    (`pod_values.evaluator`); [] for a job with `container:`: the executor refuses that job in
    Pods with its own message, and no sidecar is started. An `env:` value made from a secret
    is a `pod_values.SecretText` (see `sidecar`)."""
    payload = assignment.task.workflow_payload
    if not payload or b"services" not in payload:
        return []
    found = pod_values.single_job(payload)
    job = found[1] if found is not None else None
    if job is None or job.get("container") or not job.get("services"):
        return []
    services = job["services"]
    if not isinstance(services, Mapping):
        raise ServicesError("`services` must be a mapping of service names to containers")
    evaluate = pod_values.evaluator(assignment)
    specs: list[ContainerSpec] = []
    for name, raw in services.items():
        try:
            specs += read_job_containers(None, {name: raw}, evaluate)[1]
        except pod_values.UnevaluableValue as err:
            raise ServicesError(f"service `{name}`: {err}") from None
        except SpecError as err:
            raise ServicesError(str(err)) from None
    problems = [problem for spec in specs if (problem := _host_name_problem(spec.name))]
    listening = {spec.name: {container_port(p).split("/")[0] for p in spec.ports} for spec in specs}
    problems += port_clashes(listening)
    for spec in specs:
        if spec.volumes:
            problems.append(f"service `{spec.name}`: `volumes` are not supported for services in Pod pools yet")
    if problems:
        raise ServicesError("; ".join(problems))
    return specs


def _host_name_problem(name: str) -> str:
    host = name.lower()
    if not HOST_NAME_RE.fullmatch(host) or host == EXECUTOR_CONTAINER:
        return (
            f"service `{name}`: in Pod pools a service name is a host name and a container name: letters, "
            f"digits and '-' (not `{EXECUTOR_CONTAINER}`)"
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
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "runAsNonRoot": pod_security == "restricted",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if pod_security == "restricted":
        security["capabilities"] = {"drop": ["ALL"]}
    if spec.user:
        security.update(_user(spec))
    container: dict[str, Any] = {
        "name": container_name(spec),
        "image": spec.image,
        "restartPolicy": "Always",
        "env": pod_values.env_entries(container_name(spec), spec.env, secret_name=secret_name),
        "securityContext": security,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    ports = [_port(spec, p) for p in spec.ports]
    if ports:
        container["ports"] = ports
    if spec.entrypoint:
        container["command"] = [spec.entrypoint]
    if spec.workdir:
        container["workingDir"] = spec.workdir
    limits = _limits(spec)
    if limits:
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    if spec.health is not None:
        container["startupProbe"] = startup_probe(spec)
    return container


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


def _user(spec: ContainerSpec) -> dict[str, int]:
    user, _, group = spec.user.partition(":")
    if not user.isdigit() or (group and not group.isdigit()):
        raise ServicesError(
            f"service `{spec.name}`: `--user {spec.user}`: in Pod pools a user is numeric, uid[:gid] "
            "(Kubernetes cannot look names up in the image)"
        )
    found = {"runAsUser": int(user)}
    if group:
        found["runAsGroup"] = int(group)
    return found


def _port(spec: ContainerSpec, port: str) -> dict[str, Any]:
    number, _, protocol = container_port(port).partition("/")
    if not number.isdigit() or not 0 < int(number) < 65536:
        raise ServicesError(f"service `{spec.name}`: port {port!r} is not a port number")
    return {"containerPort": int(number), "protocol": (protocol or "tcp").upper()}


def _limits(spec: ContainerSpec) -> dict[str, str]:
    limits = {}
    if spec.cpus:
        try:
            cpus = float(spec.cpus)
        except ValueError:
            cpus = -1.0
        if cpus <= 0:
            raise ServicesError(f"service `{spec.name}`: `--cpus {spec.cpus}`: expected a positive number")
        limits["cpu"] = f"{max(1, round(cpus * 1000))}m"
    if spec.memory:
        match = _MEMORY_RE.fullmatch(spec.memory.strip().lower())
        if match is None:
            raise ServicesError(f"service `{spec.name}`: `--memory {spec.memory}`: expected a size such as 512m or 2g")
        limits["memory"] = match.group(1) + _MEMORY_UNITS[match.group(2)]
    return limits


def secret_env(specs: Sequence[ContainerSpec]) -> dict[str, str]:
    """The services' `env:` values made from secrets: data for the job's Secret."""
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


def pull_secret(
    specs: Sequence[ContainerSpec], *, name: str, namespace: str, labels: Mapping[str, str]
) -> dict[str, Any] | None:
    """The services' `credentials` as one `kubernetes.io/dockerconfigjson` Secret (None when
    no service has any); it is owned by the Pod, so deleted with it."""
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
