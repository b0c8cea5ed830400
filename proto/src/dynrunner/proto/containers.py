"""`container:` and `services:` as typed specs: pure functions of the evaluated workflow values,
shared by the executor (podman) and the Kubernetes backend (a Pod's service sidecars).

What is read, and what is refused with the name of the thing refused, is in docs/containers.md
("`container:` and `services:` keys"): an `options` subset (user, cpus, memory, health, env,
workdir, entrypoint) and nothing else, so an option that would weaken the job's boundary
(`--privileged`, `--cap-add`, `--network host`, `-v /:/host` through options …) never slips by.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SERVICES_PROVIDED_ENV = "DYNRUNNER_SERVICES_PROVIDED"
"""Set for an executor whose environment already runs the job's services (a Kubernetes Pod's
sidecars): their names, comma-separated; the executor then starts none itself."""
JOB_CONTAINER_SOCKET_ENV = "DYNRUNNER_JOB_CONTAINER_SOCKET"
"""Set for an executor whose Pod runs the job container (`job`, command `dynrunner-agent`):
the agent's socket in the shared `emptyDir` (`/__dynrunner/agent.sock`); no podman then."""
JOB_CONTAINER_NODE_ENV = "DYNRUNNER_JOB_CONTAINER_NODE"
"""Beside JOB_CONTAINER_SOCKET_ENV: where the job container sees the staged Node binary
(`/__dynrunner/node/bin/node`), for Node actions."""
JOB_CONTAINER = "jobs.<job_id>.container"
JOB_CONTAINER_ENV = "jobs.<job_id>.container.env.<env_id>"
JOB_CONTAINER_CREDENTIALS = "jobs.<job_id>.container.credentials"
SERVICES = "jobs.<job_id>.services"
SERVICE_ENV = "jobs.<job_id>.services.<service_id>.env.<env_id>"
SERVICE_CREDENTIALS = "jobs.<job_id>.services.<service_id>.credentials"

VOLUME_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
SERVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_KNOWN = {
    "--user": "user",
    "-u": "user",
    "--cpus": "cpus",
    "--memory": "memory",
    "-m": "memory",
    "--health-cmd": "health_cmd",
    "--health-interval": "health_interval",
    "--health-timeout": "health_timeout",
    "--health-retries": "health_retries",
    "--health-start-period": "health_start_period",
    "--env": "env",
    "-e": "env",
    "--workdir": "workdir",
    "-w": "workdir",
    "--entrypoint": "entrypoint",
}

Text = Callable[[str, Any], str]
"""Evaluates one value at a place (`scope.Evaluator.text`)."""


class SpecError(ValueError):
    """A `container:`/`services:` value this runner refuses; the message names it."""


@dataclass(frozen=True, slots=True)
class Health:
    """Docker's health options; defaults are Docker's (30 s, 30 s, 3 retries, no start period)."""

    command: str
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    """`job` for the job container, else the service's id (also its host name)."""
    image: str
    env: Mapping[str, str] = field(default_factory=dict)
    credentials: tuple[str, str] | None = None
    volumes: tuple[str, ...] = ()
    ports: tuple[str, ...] = ()
    user: str = ""
    cpus: str = ""
    memory: str = ""
    workdir: str = ""
    entrypoint: str = ""
    health: Health | None = None

    @property
    def is_service(self) -> bool:
        return self.name != "job"


def image_problem(image: str) -> str:
    """Why `image` cannot name an image ('' when it can): it goes to podman as one argument,
    so one that starts with `-` would be read as an option."""
    if not image:
        return "no image is named"
    if image.startswith("-") or any(c.isspace() for c in image):
        return f"{image!r} is not an image name"
    return ""


def duration(text: str, option: str) -> float:
    """A Docker duration (`10s`, `1m30s`, `500ms`) in seconds."""
    text = text.strip()
    parts = _DURATION_RE.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise SpecError(f"`{option} {text}`: expected a duration such as 10s, 1m30s or 500ms")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def parse_options(options: str, where: str) -> dict[str, Any]:
    """The supported options of `options:` (docker run flags); any other fails naming it."""
    try:
        words = shlex.split(options)
    except ValueError as err:
        raise SpecError(f"{where}: `options` could not be split into words: {err}") from None
    found: dict[str, Any] = {"env": {}}
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        key = _KNOWN.get(flag)
        if key is None:
            raise SpecError(
                f"{where}: `{flag}` is not supported in `options` (supported: --user, --cpus, --memory, "
                "--health-cmd, --health-interval, --health-timeout, --health-retries, --health-start-period, "
                "--env, --workdir, --entrypoint)"
            )
        if not eq:
            i += 1
            if i >= len(words):
                raise SpecError(f"{where}: `{flag}` in `options` needs a value")
            value = words[i]
        if key == "env":
            name, has, val = value.partition("=")
            if not has or not name:
                raise SpecError(f"{where}: `{flag} {value}` in `options`: expected NAME=value")
            found["env"][name] = val
        elif key == "health_retries":
            if not value.isdigit():
                raise SpecError(f"{where}: `{flag} {value}`: expected a number")
            found[key] = int(value)
        elif key in ("health_interval", "health_timeout", "health_start_period"):
            found[key] = duration(value, flag)
        else:
            found[key] = value
        i += 1
    return found


def _credentials(raw: Any, where: str, place: str, text: Text) -> tuple[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or set(raw) - {"username", "password"}:
        raise SpecError(f"{where}: `credentials` must be a mapping with `username` and `password`")
    username, password = text(place, raw.get("username")), text(place, raw.get("password"))
    if not username or not password:
        raise SpecError(f"{where}: `credentials` needs both `username` and `password` (one is empty)")
    return username, password


def _strings(raw: Any, where: str, key: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(v, (str, int)) for v in raw):
        raise SpecError(f"{where}: `{key}` must be a list of strings")
    return tuple(str(v) for v in raw)


def read_container(
    raw: Any, name: str, text: Text, *, place: str, env_place: str, credentials_place: str
) -> ContainerSpec:
    """One container of the job (`name` `job`) or a service, from its workflow value."""
    where = "`container`" if name == "job" else f"service `{name}`"
    if isinstance(raw, str):
        raw = {"image": raw}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be an image name or a mapping with `image`")
    unknown = set(raw) - {"image", "env", "credentials", "volumes", "ports", "options"}
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    image = text(place, raw.get("image")).strip()
    if not image:
        raise SpecError(f"{where} has no `image`")
    if image.startswith("docker://"):
        image = image.removeprefix("docker://")
    if problem := image_problem(image):
        raise SpecError(f"{where}: {problem}")
    env_raw = raw.get("env") or {}
    if not isinstance(env_raw, Mapping):
        raise SpecError(f"{where}: `env` must be a mapping")
    env = {str(k): text(env_place, v) for k, v in env_raw.items()}
    options = parse_options(text(place, raw.get("options") or ""), where)
    env.update(options.pop("env"))
    health = None
    if "health_cmd" in options:
        health = Health(
            command=options["health_cmd"],
            interval_s=options.get("health_interval", 30.0),
            timeout_s=options.get("health_timeout", 30.0),
            retries=options.get("health_retries", 3),
            start_period_s=options.get("health_start_period", 0.0),
        )
    elif any(k.startswith("health_") for k in options):
        raise SpecError(f"{where}: health options without `--health-cmd`")
    volumes = tuple(text(place, v) for v in _strings(raw.get("volumes"), where, "volumes"))
    for volume in volumes:
        source, _, target = volume.partition(":")
        if not source or not target.startswith("/"):
            raise SpecError(f"{where}: volume {volume!r}: expected name:/path (a named volume)")
        if not VOLUME_NAME_RE.fullmatch(source):
            raise SpecError(
                f"{where}: volume {volume!r}: only named volumes are mounted, never a path of the machine the "
                "job runs on (it would reach past the job's environment); use name:/path"
            )
    return ContainerSpec(
        name=name,
        image=image,
        env=env,
        credentials=_credentials(raw.get("credentials"), where, credentials_place, text),
        volumes=volumes,
        ports=tuple(text(place, p) for p in _strings(raw.get("ports"), where, "ports")),
        user=options.get("user", ""),
        cpus=options.get("cpus", ""),
        memory=options.get("memory", ""),
        workdir=options.get("workdir", ""),
        entrypoint=options.get("entrypoint", ""),
        health=health,
    )


def read_job_containers(
    container: Any, services: Mapping[str, Any], text: Text
) -> tuple[ContainerSpec | None, list[ContainerSpec]]:
    """The job container (None without `container:`, or when its image evaluates to nothing:
    `container: ${{ matrix.image }}` with an empty entry runs on the runner, as on GitHub) and
    the services, in the workflow's order."""
    job = None
    image = container.get("image") if isinstance(container, Mapping) else container
    if container and isinstance(image, str) and not text(JOB_CONTAINER, image).strip():
        container = None
    if container:
        job = read_container(
            container,
            "job",
            text,
            place=JOB_CONTAINER,
            env_place=JOB_CONTAINER_ENV,
            credentials_place=JOB_CONTAINER_CREDENTIALS,
        )
    found = []
    for name, raw in services.items():
        if not SERVICE_NAME_RE.fullmatch(str(name)) or name == "job":
            raise SpecError(f"service name {name!r}: expected letters, digits, '.', '_' or '-' (and not `job`)")
        found.append(
            read_container(
                raw, str(name), text, place=SERVICES, env_place=SERVICE_ENV, credentials_place=SERVICE_CREDENTIALS
            )
        )
    return job, found


def container_port(port: str) -> str:
    """The container side of a `ports:` entry (`8080:80` → `80`, `6379` → `6379`, `53/udp`)."""
    return port.rsplit(":", 1)[-1]


def port_clashes(listening: Mapping[str, set[str]]) -> list[str]:
    """Two services of one network namespace on one port: what to say about each clash."""
    owner: dict[str, str] = {}
    clashes = []
    for name, ports in listening.items():
        for port in sorted(ports):
            if port in owner:
                clashes.append(f"services `{owner[port]}` and `{name}` both listen on port {port}")
            else:
                owner[port] = name
    return clashes
