"""A job's containers with podman (local and VM pools): job container, services, cleanup.

One network namespace per job, held by the job container (or, for a job with services only,
by a small holder container running the agent): services join it, so they are reachable on
`localhost` and by name (`--add-host <service>:127.0.0.1` on the holder; the containers that
join share its hosts file), as sidecars of a Pod are. Every container carries the label
`dynrunner.io/job=<prefix>` and `close` removes them all, whatever happened.

podman's own health checks need systemd timers, which a VM or a plain machine may lack; the
executor probes (`podman exec <service> /bin/sh -c <--health-cmd>`) itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynrunner.executor.containers.agent import SOCKET_NAME, AgentProcesses
from dynrunner.executor.containers.spec import ContainerSpec, container_port, port_clashes

PODMAN_ENV = "DYNRUNNER_PODMAN"
"""The podman command line (`podman --runtime runc --cgroup-manager=cgroupfs`); default `podman`."""
PODMAN_RUN_ENV = "DYNRUNNER_PODMAN_RUN_OPTIONS"
"""Options for every `podman run` (`--ulimit nofile=1024:1024`), where the machine needs them."""
AGENT_ENV = "DYNRUNNER_AGENT"
"""The `dynrunner-agent` binary (agent/, `make agent`); default `dynrunner-agent` on PATH."""
AGENT_MOUNT = "/__dynrunner"
NODE_MOUNT = f"{AGENT_MOUNT}/node/bin/node"
LABEL = "dynrunner.io/job"
LOG_TAIL = 20
AGENT_WAIT_S = 60.0


def _listening(socket: Path) -> bool:
    """The agent renames its socket into place once it listens (a stat; no thread needed)."""
    return socket.exists()


class ContainerError(RuntimeError):
    """The job's containers could not be started (or a service is unhealthy); the message says why."""


@dataclass(frozen=True, slots=True)
class PodmanConfig:
    argv: tuple[str, ...]
    run_options: tuple[str, ...] = ()
    agent: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PodmanConfig | None:
        """The configuration, or None when podman is not installed here."""
        argv = tuple(shlex.split(env.get(PODMAN_ENV, ""))) or ("podman",)
        found = shutil.which(argv[0], path=env.get("PATH", os.defpath))
        if found is None:
            return None
        agent = env.get(AGENT_ENV, "") or shutil.which("dynrunner-agent", path=env.get("PATH", os.defpath)) or ""
        return cls(argv=(found, *argv[1:]), run_options=tuple(shlex.split(env.get(PODMAN_RUN_ENV, ""))), agent=agent)


class Podman:
    def __init__(self, config: PodmanConfig) -> None:
        self.config = config

    async def call(
        self, *args: str, limit_s: float = 600.0, env: Mapping[str, str] | None = None
    ) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *self.config.argv,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), limit_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return 124, "", f"podman {args[0]} did not answer within {limit_s:.0f} s"
        except asyncio.CancelledError:  # the job was cancelled meanwhile: podman goes too
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
            raise
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    async def check(self, *args: str, what: str, limit_s: float = 600.0) -> str:
        code, out, err = await self.call(*args, limit_s=limit_s)
        if code != 0:
            raise ContainerError(f"{what}: {err.strip()[-1500:] or f'podman exited with {code}'}")
        return out


def registry_of(image: str) -> str:
    """The registry an image name points at (Docker's rule: a first part with `.` or `:`, or `localhost`)."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def auth_file(specs: Iterable[ContainerSpec]) -> dict[str, Any]:
    """A containers-auth.json for the specs with `credentials`."""
    auths = {}
    for spec in specs:
        if spec.credentials is not None:
            token = base64.b64encode(":".join(spec.credentials).encode()).decode()
            auths[registry_of(spec.image)] = {"auth": token}
    return {"auths": auths}


def resource_flags(spec: ContainerSpec) -> list[str]:
    flags = []
    if spec.user:
        flags += ["--user", spec.user]
    if spec.cpus:
        flags += ["--cpus", spec.cpus]
    if spec.memory:
        flags += ["--memory", spec.memory]
    for volume in spec.volumes:
        flags += ["--volume", volume]
    for key in spec.env:
        flags += ["--env", key]  # the value comes from podman's environment: never on a command line
    return flags


@dataclass
class Started:
    name: str
    spec: ContainerSpec
    id: str = ""
    ports: dict[str, str] = field(default_factory=dict)


class JobContainers:
    """The containers of one job; `start` before the first step, `close` after the last
    (`JobContainerSource`, containers/source.py)."""

    node_mount = NODE_MOUNT
    identity_reachable = False
    """A podman job container has its own network namespace and no Workload API socket."""
    workload_api_reachable = False

    def __init__(
        self,
        podman: Podman,
        *,
        job_id: str,
        root: Path,
        runtime_dir: Path,
        log: Callable[[str], None],
        node: str = "",
    ) -> None:
        self.podman = podman
        self.prefix = f"dynrunner-{job_id}-{secrets.token_hex(3)}"
        self.root = root
        self.state_dir = runtime_dir / "containers"
        self.log = log
        self.node = node
        self.job: Started | None = None
        self.services: list[Started] = []
        self.holder = ""
        self.holder_id = ""
        self.image_env: dict[str, str] = {}
        self.processes: AgentProcesses | None = None
        self.agent_dir: Path | None = None

    @property
    def network(self) -> str:
        return f"container:{self.holder}" if self.holder else ""

    # -- start ----------------------------------------------------------------------------------

    def _prepare(self, specs: Sequence[ContainerSpec]) -> tuple[Path, Path | None]:
        """The agent's directory and the registry auth file (None without `credentials`)."""
        config = self.podman.config
        if not config.agent or not os.access(config.agent, os.X_OK):
            raise ContainerError(
                f"the container agent (dynrunner-agent) is not installed here: build it with `make agent` and put it "
                f"on PATH, or set {AGENT_ENV} to its path"
            )
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A unix socket's path has at most 107 bytes and a job's root can be deep: the agent's
        # directory lives in a short temporary directory of its own, removed by `close`.
        short = "/tmp" if os.path.isdir("/tmp") else None  # not $TMPDIR: a local job's is deep
        agent_dir = self.agent_dir = Path(tempfile.mkdtemp(prefix="dynrunner-agent-", dir=short))
        agent_dir.chmod(0o755)
        shutil.copy2(config.agent, agent_dir / "dynrunner-agent")
        (agent_dir / "node" / "bin").mkdir(parents=True, exist_ok=True)
        if not any(s.credentials for s in specs):
            return agent_dir, None
        auth = self.state_dir / "auth.json"
        fd = os.open(auth, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fp:
            json.dump(auth_file(specs), fp)
        return agent_dir, auth

    async def start(self, job: ContainerSpec | None, services: Sequence[ContainerSpec]) -> None:
        specs = ([job] if job else []) + list(services)
        agent_dir, auth = self._prepare(specs)
        images = {}
        for spec in specs:
            if spec.image not in images:
                images[spec.image] = await self._image(spec.image, auth)
        listening = {
            s.name: {container_port(p) for p in s.ports} | set(images[s.image].get("ports", ())) for s in services
        }
        clashes = port_clashes(listening)
        if clashes:
            raise ContainerError(
                "; ".join(clashes) + ": services share the job's network, so each port can be used once"
            )
        mounts = ["--volume", f"{self.root}:{self.root}", "--volume", f"{agent_dir}:{AGENT_MOUNT}"]
        if self.node:
            mounts += ["--volume", f"{self.node}:{NODE_MOUNT}:ro"]
        hosts = [f"--add-host={s.name}:127.0.0.1" for s in services]
        labels = ["--label", f"{LABEL}={self.prefix}"]
        agent = [f"--entrypoint={AGENT_MOUNT}/dynrunner-agent"]
        socket = [f"{AGENT_MOUNT}/{SOCKET_NAME}"]
        if job is not None:
            name = f"{self.prefix}-job"
            workdir = ["--workdir", job.workdir] if job.workdir else []
            self.log(f"Starting job container {job.image}")
            cid = await self._run(
                name, job, [*labels, *hosts, *mounts, *workdir, *agent], [job.image, *socket], job.env
            )
            self.job = Started(name, job, cid)
            self.holder, self.holder_id = name, cid
            self.image_env = await self._container_env(name)
        elif services:
            name = f"{self.prefix}-net"
            publish = [f"--publish={p}" for s in services for p in s.ports]
            first = services[0].image
            holder = [*labels, *hosts, *publish, "--volume", f"{agent_dir}:{AGENT_MOUNT}", *agent, "--user=0"]
            cid = await self._run(name, None, holder, [first, *socket], {})
            self.holder, self.holder_id = name, cid
        for spec in services:
            name = f"{self.prefix}-{spec.name}"
            self.log(f"Starting service {spec.name}: {spec.image}")
            entry = [f"--entrypoint={spec.entrypoint}"] if spec.entrypoint else []
            cid = await self._run(name, spec, [*labels, f"--network={self.network}", *entry], [spec.image], spec.env)
            self.services.append(Started(name, spec, cid))
        if self.holder:
            await self._wait_agent(agent_dir / SOCKET_NAME)
        if job is not None:
            self.processes = AgentProcesses(agent_dir / SOCKET_NAME)
        if not job and services:
            await self._published()
        await asyncio.gather(*(self._healthy(s) for s in self.services))

    async def _image(self, image: str, auth: Path | None) -> dict[str, Any]:
        """The image here (pulled when missing): its exposed ports. One podman call when it is here."""
        code, out, _ = await self.podman.call("image", "inspect", image, limit_s=60)
        if code != 0:
            self.log(f"Pulling image {image}")
            args = ["pull", "--quiet", *(["--authfile", str(auth)] if auth else []), image]
            await self.podman.check(*args, what=f"image {image} could not be pulled", limit_s=1800)
            out = await self.podman.check("image", "inspect", image, what=f"image {image} could not be inspected")
        config = (json.loads(out) or [{}])[0].get("Config") or {}
        ports = {p.partition("/")[0] if p.endswith("/tcp") else p for p in config.get("ExposedPorts") or {}}
        return {"ports": ports}

    async def _run(
        self, name: str, spec: ContainerSpec | None, flags: list[str], tail: list[str], env: Mapping[str, str]
    ) -> str:
        args = ["run", "--detach", "--name", name, *self.podman.config.run_options, *flags]
        if spec is not None:
            args += resource_flags(spec)
        what = f"{'service ' + spec.name if spec and spec.is_service else 'the job container'} could not be started"
        code, out, err = await self.podman.call(*args, *tail, env={**os.environ, **env})
        if code != 0:
            raise ContainerError(f"{what}: {err.strip()[-1500:] or f'podman exited with {code}'}")
        return out.strip()

    async def _wait_agent(self, socket: Path) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + AGENT_WAIT_S
        while not _listening(socket):
            state = await self._state(self.holder)
            if state not in ("running", "created", "configured", "initialized"):
                raise ContainerError(
                    f"the job container stopped before its agent started ({state}):\n{await self._logs(self.holder)}"
                )
            if loop.time() > end:
                raise ContainerError(f"the job container's agent did not start within {AGENT_WAIT_S:.0f} s")
            await asyncio.sleep(0.02)

    async def _container_env(self, name: str) -> dict[str, str]:
        """The job container's environment as podman made it (the image's, HOME for its user, `env`)."""
        out = await self.podman.check(
            "inspect", "--format", "{{json .Config.Env}}", name, what="the job container could not be inspected"
        )
        return dict(item.partition("=")[::2] for item in json.loads(out) or [])

    async def _state(self, name: str) -> str:
        code, out, _ = await self.podman.call("inspect", "--format", "{{.State.Status}}", name, limit_s=60)
        return out.strip() if code == 0 else "gone"

    async def _ended(self, name: str, state: str) -> str:
        code, out, _ = await self.podman.call("inspect", "--format", "{{.State.ExitCode}}", name, limit_s=60)
        return f"it exited with code {out.strip()}" if code == 0 and out.strip() else f"it is {state}"

    async def _logs(self, name: str) -> str:
        _, out, err = await self.podman.call("logs", "--tail", str(LOG_TAIL), name, limit_s=60)
        return (out + err).rstrip()

    async def _published(self) -> None:
        """For steps on the host: each service port's host port (`job.services.<id>.ports`)."""
        _, out, _ = await self.podman.call("port", self.holder, limit_s=60)
        mapped = {}
        for line in out.splitlines():  # "6379/tcp -> 0.0.0.0:32768"
            inner, _, outer = line.partition(" -> ")
            if outer:
                mapped[inner.partition("/")[0]] = outer.rpartition(":")[2]
        for started in self.services:
            started.ports = {container_port(p): mapped.get(container_port(p), "") for p in started.spec.ports}

    async def _healthy(self, started: Started) -> None:
        """Until the service is healthy; ContainerError naming it, with its last output, if not."""
        health = started.spec.health
        name = started.spec.name
        if health is None:
            state = await self._state(started.name)
            if state != "running":
                reason = await self._ended(started.name, state)
                raise ContainerError(
                    f"Service '{name}' is not running: {reason}. Its last output:\n{await self._logs(started.name)}"
                )
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + health.start_period_s + health.interval_s * health.retries
        every = min(health.interval_s, 0.1)  # fast while the service starts, then at most 1 s apart
        self.log(f"Waiting for service {name} to be healthy")
        probe_output = ""
        while True:
            state = await self._state(started.name)
            if state != "running":
                reason = await self._ended(started.name, state)
                break
            code, out, err = await self.podman.call(
                "exec", started.name, "/bin/sh", "-c", health.command, limit_s=health.timeout_s + 5
            )
            if code == 0:
                self.log(f"Service {name} is healthy")
                return
            probe_output = (out + err).strip()[-2000:]
            if loop.time() + every > end:
                reason = (
                    f"its health check `{health.command}` still failed after "
                    f"{health.start_period_s + health.interval_s * health.retries:.0f} s (exit code {code})"
                )
                break
            await asyncio.sleep(every)
            every = min(every * 2, health.interval_s, 1.0)
        parts = [f"Service '{name}' is unhealthy: {reason}."]
        if probe_output:
            parts.append(f"Last health check output:\n{probe_output}")
        parts.append(f"Last output of {name}:\n{await self._logs(started.name)}")
        raise ContainerError("\n".join(parts))

    # -- contexts -------------------------------------------------------------------------------

    def job_context(self) -> dict[str, Any] | None:
        if self.job is None:
            return None
        return {"id": self.job.id, "network": self.network}

    def services_context(self) -> dict[str, Any]:
        return {s.spec.name: {"id": s.id, "network": self.network, "ports": dict(s.ports)} for s in self.services}

    # -- end ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Remove every container of the job (services first: they use the holder's network)."""
        _, out, _ = await self.podman.call("ps", "--all", "--quiet", "--filter", f"label={LABEL}={self.prefix}")
        others = [i for i in out.split() if not (self.holder_id and self.holder_id.startswith(i))]
        if others:
            await self.podman.call("rm", "--force", "--time", "1", *others, limit_s=120)
        if self.holder:
            await self.podman.call("rm", "--force", "--time", "1", self.holder, limit_s=120)
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / "auth.json").unlink()
        if self.agent_dir is not None:
            shutil.rmtree(self.agent_dir, ignore_errors=True)
