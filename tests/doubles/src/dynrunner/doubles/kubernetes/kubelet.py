"""A kubelet double: registers its Node, and for each Pod bound to it mounts the volumes,
"pulls" the images (as configured in `Image`s), and really runs each container as a local
process in a session of its own, reporting phases, container states, conditions and
events as pkg/kubelet does (restartPolicy Never).

Init containers run in spec order, as kuberuntime's computeInitContainerActions does: a
regular one runs to completion before the next one starts (exit 0 → terminated Completed,
`ready: true`); one that fails fails the Pod (phase Failed, its terminated state, Initialized
False "containers with incomplete status: [...]"; `kubectl` renders that as `Init:Error`);
a native sidecar (`restartPolicy: Always`) is started, and the next one waits for its startup
probe. The main containers then start together and the Pod runs while any of them runs (a
`job` container beside `executor` keeps it Running until it exits too), then the sidecars stop.

Termination follows the kubelet's killPod: a Pod deleted by someone else (deletionTimestamp
set) gets a `Killing` event, SIGTERM, its grace period, SIGKILL, a final status, then the
kubelet's own delete with grace 0; activeDeadlineSeconds → phase Failed, reason
DeadlineExceeded; `evict()` → Failed/Evicted; `oom_kill()` → OOMKilled (exit 137).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynrunner.doubles.kubernetes import containers, podstatus, resources, status
from dynrunner.doubles.kubernetes.events import Recorder
from dynrunner.doubles.kubernetes.images import Image, image_id, pull_error_message
from dynrunner.doubles.kubernetes.objects import clone
from dynrunner.doubles.kubernetes.store import Obj, Store, now

TERMINATION_MESSAGE_LIMIT = 4096
"""`kubecontainer.MaxContainerTerminationMessageLength`."""


@dataclass(frozen=True)
class ContainerRef:
    """What SPIRE's k8s workload attestor learns about a process."""

    node: str
    namespace: str
    pod_name: str
    pod_uid: str
    container: str
    service_account: str


@dataclass
class KubeletOptions:
    root: Path
    images: dict[str, Image] = field(default_factory=dict)
    pull_backoff: float = 10.0  # the kubelet's image back-off starts at 10 s and doubles to 300 s
    retry: float = 1.0  # how soon a failed mount or container config is tried again
    # CSI drivers → host directory the volume shows (csi.spiffe.io → the node's Workload API socket dir).
    csi: dict[str, Path] = field(default_factory=dict)


class _Terminate(Exception):
    pass


class _InitFailed(Exception):
    """A regular init container failed: with restartPolicy Never the Pod fails."""


def _has(pod: Obj, name: str) -> bool:
    return any(c["name"] == name for kind in ("initContainers", "containers") for c in pod["spec"].get(kind) or [])


class PodWorker:
    def __init__(self, kubelet: Kubelet, pod: Obj) -> None:
        self.kubelet = kubelet
        self.namespace = pod["metadata"]["namespace"]
        self.name = pod["metadata"]["name"]
        self.uid = pod["metadata"]["uid"]
        self.root = kubelet.options.root / "pods" / self.uid
        self.stop = asyncio.Event()
        self.kill: tuple[str, str, int, str] | None = None  # (pod reason, message, grace, container reason)
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.started_at: dict[str, str] = {}
        self.container_ids: dict[str, str] = {}
        self.oom_killed: set[str] = set()
        self.sidecars: dict[str, asyncio.subprocess.Process] = {}
        """Native sidecars (init containers with `restartPolicy: Always`) now running."""

    def processes(self) -> list[asyncio.subprocess.Process]:
        """Every process of the Pod: main and running init containers, and sidecars."""
        return [*self.procs.values(), *self.sidecars.values()]

    # --- store access -------------------------------------------------------------------
    def pod(self) -> Obj | None:
        return self.kubelet.store.peek(resources.PODS, self.namespace, self.name)

    def write(self, mutate: Callable[[dict[str, Any]], None]) -> None:
        if self.kubelet.lost:
            return
        current = self.pod()
        if current is None or current["metadata"]["uid"] != self.uid:
            raise _Terminate
        new = clone(current)
        mutate(new["status"])
        with contextlib.suppress(status.ApiError):
            self.kubelet.store.update(resources.PODS, self.namespace, self.name, new, "status")

    def event(self, type_: str, reason: str, message: str, container: str = "", kind: str = "") -> None:
        pod = self.pod()
        if pod is None or self.kubelet.lost:
            return
        if container and not kind:
            kind = self.spec_of(pod, container)[1] if _has(pod, container) else "containers"
        presented = {**pod, "apiVersion": "v1", "kind": "Pod"}
        self.kubelet.recorder.event(
            presented, type_, reason, message, f"spec.{kind}{{{container}}}" if container else ""
        )

    def set_init_container(self, name: str, entry: dict[str, Any]) -> None:
        self.set_container(name, entry)

    def set_container(self, name: str, entry: dict[str, Any]) -> None:
        """Replace the status of container `name`, in whichever list holds it (init or main)."""

        def mutate(st: dict[str, Any]) -> None:
            for key in ("initContainerStatuses", "containerStatuses"):
                st[key] = [entry if c["name"] == name else c for c in st.get(key) or []]
            if not st["initContainerStatuses"]:
                del st["initContainerStatuses"]

        self.write(mutate)

    def spec_of(self, pod: Obj, name: str) -> tuple[dict[str, Any], str]:
        """A container's spec and its list (`containers` or `initContainers`)."""
        for kind in ("initContainers", "containers"):
            for spec in pod["spec"].get(kind) or []:
                if spec["name"] == name:
                    return spec, kind
        raise KeyError(name)

    async def pause(self, seconds: float) -> None:
        """Sleep, unless the Pod is to be terminated meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        if self.stop.is_set():
            raise _Terminate

    # --- lifecycle ----------------------------------------------------------------------
    async def run(self) -> None:
        pod = self.pod()
        if pod is None:
            return
        specs = pod["spec"]["containers"]
        names = [c["name"] for c in specs]
        inits = pod["spec"].get("initContainers") or []
        deadline = pod["spec"].get("activeDeadlineSeconds")
        node_ip = "127.0.0.1"

        def initial(st: dict[str, Any]) -> None:
            st.update(hostIP=node_ip, hostIPs=[{"ip": node_ip}], podIP=self.kubelet.pod_ip(), startTime=now())
            st["podIPs"] = [{"ip": st["podIP"]}]
            # convertToAPIContainerStatuses: every container's default state is waiting, reason
            # PodInitializing when the Pod has init containers, else ContainerCreating.
            default = podstatus.waiting("PodInitializing" if inits else "ContainerCreating")
            for key, listed in (("initContainerStatuses", inits), ("containerStatuses", specs)):
                if listed:
                    st[key] = [podstatus.container_status(c["name"], c["image"], default) for c in listed]
            podstatus.pending_conditions(st, names, [c["name"] for c in inits])

        try:
            self.write(initial)
            timer = asyncio.get_running_loop().call_later(deadline, self._deadline) if deadline else None
            try:
                await self._mount(pod)
                for spec in inits:
                    await self._pull(spec)
                    env = await self._configure(pod, spec)
                    if spec.get("restartPolicy") == "Always":
                        await self._sidecar(pod, spec, env)
                    else:
                        await self._init(pod, spec, env)
                if inits:
                    self.write(podstatus.initialized)
                for spec in specs:
                    await self._pull(spec)
                envs = {spec["name"]: await self._configure(pod, spec) for spec in specs}
                for spec in specs:
                    await self._start(pod, spec, envs[spec["name"]])
                self.write(podstatus.running_conditions)
                self.write(lambda st: st.update(phase="Running"))
                await self._wait_processes()
                await self._stop_sidecars()
            except _InitFailed:
                await self._stop_sidecars()
                self.write(lambda st: podstatus.init_failed(st, inits))
                return
            except _Terminate:
                await self._terminate()
                await self._stop_sidecars()
            finally:
                if timer is not None:
                    timer.cancel()
            self._finish(specs)
        except _Terminate:
            pass
        finally:
            for proc in self.procs.values():
                self.kubelet.registry.pop(proc.pid, None)
            if not self.kubelet.lost:
                self._remove_if_deleted()

    async def _init(self, pod: Obj, spec: dict[str, Any], env: dict[str, str]) -> None:
        """Run a regular init container to completion (the next container waits for it). A
        non-zero exit (or a start error) fails the Pod: restartPolicy Never does not retry it."""
        name = spec["name"]
        proc = await self._launch(pod, spec, env)
        if proc is None:
            raise _InitFailed(name)
        self.procs[name] = proc  # so a deletion or deadline meanwhile kills and records it
        exited = asyncio.ensure_future(proc.wait())
        stop = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait([exited, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not exited.done():
            exited.cancel()
            raise _Terminate
        del self.procs[name]
        _end_container(proc)
        self.kubelet.registry.pop(proc.pid, None)
        self._record_exit(name, exited.result(), None)
        if exited.result() != 0:
            raise _InitFailed(name)

    async def _sidecar(self, pod: Obj, spec: dict[str, Any], env: dict[str, str]) -> None:
        """Start a native sidecar and return once it has started: running, and its startup
        probe passed (the kubelet starts the next container only then). A probe failing
        `failureThreshold` times, or an exit, restarts it: `restartCount`, `lastState` with the
        log's tail (FallbackToLogsOnError), an `Unhealthy` event per failed probe."""
        name, reference = spec["name"], spec["image"]
        image = self.kubelet.options.images[reference]
        restarts, last = 0, dict[str, Any]()
        while True:
            container_id = f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}"
            environment = {key: self.paths.rewrite(value) for key, value in env.items()}
            command = [self.paths.rewrite(part) for part in containers.argv(spec, image, environment)]
            workdir = self.root / "rootfs"
            workdir.mkdir(parents=True, exist_ok=True)
            logs = self.root / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            self.event("Normal", "Created", f"Created container: {name}", name, "initContainers")
            with (logs / f"{name}.log").open("ab") as log:
                proc = await asyncio.create_subprocess_exec(
                    *command,
                    cwd=workdir,
                    env=environment,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            self.sidecars[name] = proc
            started_at = now()
            self.started_at[name], self.container_ids[name] = started_at, container_id
            self.event("Normal", "Started", f"Started container {name}", name, "initContainers")
            entry = podstatus.container_status(
                name, reference, {"running": {"startedAt": started_at}}, image_id=image_id(reference)
            )
            entry.update(started=False, ready=False, restartCount=restarts, lastState=last, containerID=container_id)
            self.set_init_container(name, entry)
            if await self._probe(spec, environment, workdir, proc):
                self.set_init_container(name, {**entry, "started": True, "ready": True})
                return
            if proc.returncode is None:
                self.event("Normal", "Killing", f"Container {name} failed startup probe, will be restarted", name)
                _signal(proc, signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 2)
                _signal(proc, signal.SIGKILL)
            code = await proc.wait()
            _end_container(proc)
            code = 128 - code if code < 0 else code
            last = podstatus.terminated(
                code, podstatus.exit_reason(code), started_at, container_id, self._log_tail(name) if code else ""
            )
            restarts += 1
            waiting = podstatus.waiting("CrashLoopBackOff", f"back-off restarting failed container {name}")
            self.set_init_container(name, {**entry, "state": waiting, "restartCount": restarts, "lastState": last})
            await self.pause(self.kubelet.options.retry)

    async def _probe(
        self, spec: dict[str, Any], env: dict[str, str], workdir: Path, proc: asyncio.subprocess.Process
    ) -> bool:
        """The startup probe (exec only) until it passes (True) or fails `failureThreshold`
        times or the container exits (False); without a probe, started once it runs."""
        probe = spec.get("startupProbe")
        if probe is None:
            await self.pause(0.05)
            return proc.returncode is None
        command = [self.paths.rewrite(part) for part in probe["exec"]["command"]]
        failures = 0
        while True:
            if proc.returncode is not None:
                return False
            check = await asyncio.create_subprocess_exec(
                *command,
                cwd=workdir,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            try:
                output, _ = await asyncio.wait_for(check.communicate(), probe.get("timeoutSeconds", 1))
                passed = check.returncode == 0
            except TimeoutError:
                _signal(check, signal.SIGKILL)
                output, passed = f"command timed out after {probe.get('timeoutSeconds', 1)}s".encode(), False
            if passed:
                return True
            failures += 1
            message = f"Startup probe failed: {output.decode(errors='replace').strip()}"
            self.event("Warning", "Unhealthy", message, spec["name"], "initContainers")
            if failures >= probe.get("failureThreshold", 3):
                return False
            await self.pause(probe.get("periodSeconds", 10))

    async def _stop_sidecars(self) -> None:
        """The main containers ended (or an init container failed): the kubelet stops the
        sidecars (SIGTERM, then SIGKILL) and reports each one terminated, keeping its restarts."""
        alive = {n: p for n, p in self.sidecars.items() if p.returncode is None}
        for proc in alive.values():
            _signal(proc, signal.SIGTERM)
        if not alive:
            return
        await asyncio.wait([asyncio.ensure_future(p.wait()) for p in alive.values()], timeout=5)
        for proc in alive.values():
            if proc.returncode is None:
                _signal(proc, signal.SIGKILL)
        await asyncio.gather(*(p.wait() for p in alive.values()), return_exceptions=True)
        for proc in alive.values():
            _end_container(proc)
        pod = self.pod()
        current = {s["name"]: s for s in (pod or {}).get("status", {}).get("initContainerStatuses") or []}
        for name, proc in alive.items():
            code = 128 - (proc.returncode or 0) if (proc.returncode or 0) < 0 else proc.returncode or 0
            state = podstatus.terminated(
                code, podstatus.exit_reason(code), self.started_at[name], self.container_ids[name]
            )
            with contextlib.suppress(_Terminate):
                self.set_container(name, {**current.get(name, {}), "state": state, "ready": False, "started": False})

    def _deadline(self) -> None:
        message = "Pod was active on the node longer than the specified deadline"
        pod = self.pod()
        grace = int((pod or {}).get("spec", {}).get("terminationGracePeriodSeconds", 30))
        self.terminate("DeadlineExceeded", message, grace)
        self.event("Warning", "DeadlineExceeded", message)

    def oom_kill(self, name: str) -> None:
        """One running container reaches its memory limit: SIGKILL, terminated OOMKilled."""
        proc = self.procs.get(name)
        if proc is None or proc.returncode is not None:
            raise KeyError(f"container {name} of {self.namespace}/{self.name} is not running")
        self.oom_killed.add(name)
        _signal(proc, signal.SIGKILL)

    def terminate(self, reason: str, message: str, grace: int, container_reason: str = "Error") -> None:
        if self.kill is None:
            self.kill = (reason, message, grace, container_reason)
        self.stop.set()

    async def _mount(self, pod: Obj) -> None:
        while True:
            try:
                self.paths = self.kubelet.materialize(pod, self.root)
                return
            except containers.MountError as err:
                self.event("Warning", "FailedMount", str(err))
                await self.pause(self.kubelet.options.retry)

    async def _pull(self, spec: dict[str, Any]) -> None:
        reference = spec["image"]
        name = spec["name"]
        image = self.kubelet.options.images.get(reference)
        present = reference in self.kubelet.pulled and spec.get("imagePullPolicy") != "Always"
        if present and image is not None:
            self.event("Normal", "Pulled", f'Container image "{reference}" already present on machine', name)
            return
        backoff = self.kubelet.options.pull_backoff
        while True:
            self.event("Normal", "Pulling", f'Pulling image "{reference}"', name)
            started = time.monotonic()
            if image is not None:
                await self.pause(image.pull_seconds)
                while image.pull_hold is not None and not image.pull_hold.is_set():
                    await self.pause(0.02)
            error = "not-found" if image is None else image.pull_error
            if error is None:
                took = time.monotonic() - started
                size = image.size if image else 0
                self.event(
                    "Normal",
                    "Pulled",
                    f'Successfully pulled image "{reference}" in {took:.3f}s ({took:.3f}s including waiting). '
                    f"Image size: {size} bytes.",
                    name,
                )
                self.kubelet.pulled.add(reference)
                return
            message = pull_error_message(reference, error)
            self.event("Warning", "Failed", f'Failed to pull image "{reference}": {message}', name)
            self.event("Warning", "Failed", "Error: ErrImagePull", name)
            self.set_container(
                name, podstatus.container_status(name, reference, podstatus.waiting("ErrImagePull", message))
            )
            await self.pause(min(1.0, backoff))
            back = f'Back-off pulling image "{reference}"'
            self.event("Normal", "BackOff", back, name)
            self.event("Warning", "Failed", "Error: ImagePullBackOff", name)
            self.set_container(
                name,
                podstatus.container_status(
                    name, reference, podstatus.waiting("ImagePullBackOff", f"{back}: ErrImagePull: {message}")
                ),
            )
            await self.pause(backoff)
            backoff = min(backoff * 2, 300.0)

    async def _configure(self, pod: Obj, spec: dict[str, Any]) -> dict[str, str]:
        image = self.kubelet.options.images[spec["image"]]
        while True:
            try:
                return containers.environment(
                    self.pod() or pod, spec, image, self.kubelet.secret_lookup(self.namespace)
                )
            except containers.ConfigError as err:
                self.event("Warning", "Failed", f"Error: {err}", spec["name"])
                waiting = podstatus.waiting("CreateContainerConfigError", str(err))
                self.set_container(spec["name"], podstatus.container_status(spec["name"], spec["image"], waiting))
                await self.pause(self.kubelet.options.retry)

    async def _start(self, pod: Obj, spec: dict[str, Any], env: dict[str, str]) -> None:
        proc = await self._launch(pod, spec, env)
        if proc is not None:
            self.procs[spec["name"]] = proc

    async def _launch(self, pod: Obj, spec: dict[str, Any], env: dict[str, str]) -> asyncio.subprocess.Process | None:
        """Create and start one container's process (running status, events); None when it
        could not start (terminated StartError, as runc reports an exec failure)."""
        image = self.kubelet.options.images[spec["image"]]
        name = spec["name"]
        workdir_path = spec.get("workingDir") or image.working_dir
        host_workdir = self.paths.host(workdir_path) if workdir_path else self.root / "rootfs"
        if host_workdir is None:
            host_workdir = self.root / "rootfs" / workdir_path.lstrip("/")
            self.paths.add(workdir_path, host_workdir)
        host_workdir.mkdir(parents=True, exist_ok=True)
        # Each container's terminationMessagePath is a file of its own, bind-mounted by the kubelet.
        paths = containers.PathMap(dict(self.paths.mounts))
        message_file = self.root / "termination" / name
        message_file.parent.mkdir(parents=True, exist_ok=True)
        message_file.touch(mode=0o666)
        paths.add(spec.get("terminationMessagePath") or "/dev/termination-log", message_file)
        command = [paths.rewrite(part) for part in containers.argv(spec, image, env)]
        environment = {key: paths.rewrite(value) for key, value in env.items()}
        logs = self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        container_id = f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}"
        self.event("Normal", "Created", f"Created container: {name}", name)
        with (logs / f"{name}.log").open("ab") as log:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *command,
                    cwd=host_workdir,
                    env=environment,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            except OSError as exc:
                message = (
                    "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                    "runc create failed: unable to start container process: "
                    f'exec: "{command[0] if command else ""}": {exc.strerror}'
                )
                self.event("Warning", "Failed", f"Error: {message}", name)
                started = now()
                self.set_container(
                    name,
                    podstatus.container_status(
                        name, spec["image"], podstatus.terminated(128, "StartError", started, container_id, message)
                    ),
                )
                return None
        pod_now = self.pod() or pod
        self.kubelet.registry[proc.pid] = ContainerRef(
            self.kubelet.node,
            self.namespace,
            self.name,
            self.uid,
            name,
            pod_now["spec"].get("serviceAccountName", "default"),
        )
        self.container_ids[name] = container_id
        self.started_at[name] = now()
        self.event("Normal", "Started", f"Started container {name}", name)
        state = {"running": {"startedAt": self.started_at[name]}}
        self.set_container(
            name,
            podstatus.container_status(
                name, spec["image"], state, image_id=image_id(spec["image"]), container_id=container_id
            ),
        )
        return proc

    async def _wait_processes(self) -> None:
        waits = {name: asyncio.ensure_future(proc.wait()) for name, proc in self.procs.items()}
        stop = asyncio.ensure_future(self.stop.wait())
        pending = set(waits.values())
        try:
            while pending:
                done, _ = await asyncio.wait([*pending, stop], return_when=asyncio.FIRST_COMPLETED)
                if stop in done:
                    raise _Terminate
                for name, task in waits.items():
                    if task in done and task in pending:
                        pending.discard(task)
                        _end_container(self.procs[name])
                        self._record_exit(name, task.result(), "OOMKilled" if name in self.oom_killed else None)
        finally:
            stop.cancel()

    def _record_exit(self, name: str, returncode: int, reason: str | None, message: str = "") -> None:
        code = 128 - returncode if returncode < 0 else returncode
        pod = self.pod()
        if pod is None:
            return
        spec, kind = self.spec_of(pod, name)
        if not message:
            message = self._termination_message(name)
        if not message and code != 0 and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = self._log_tail(name)
        state = podstatus.terminated(
            code, reason or podstatus.exit_reason(code), self.started_at[name], self.container_ids[name], message
        )
        entry = podstatus.container_status(
            name, spec["image"], state, image_id=image_id(spec["image"]), container_id=self.container_ids[name]
        )
        if kind == "initContainers":
            entry["ready"] = code == 0  # prober manager: a regular init container that exited 0 is ready
        self.set_container(name, entry)

    def _termination_message(self, name: str) -> str:
        """What the container wrote to its terminationMessagePath, read when it ended, on
        success and failure alike: at most its last 4096 bytes (`getTerminationMessage` reads
        with `tail.ReadAtMost`)."""
        try:
            with (self.root / "termination" / name).open("rb") as file:
                file.seek(max(0, file.seek(0, os.SEEK_END) - TERMINATION_MESSAGE_LIMIT))
                return file.read().decode(errors="replace")
        except OSError:
            return ""

    def _log_tail(self, name: str) -> str:
        """The kubelet's fallback termination message: the log's last 80 lines, at most 2048 bytes."""
        try:
            data = (self.root / "logs" / f"{name}.log").read_bytes()
        except OSError:
            return ""
        tail = b"\n".join(data.splitlines()[-80:])[-2048:]
        return tail.decode(errors="replace")

    async def _terminate(self) -> None:
        pod = self.pod()
        if self.kill is None and pod is not None and pod["metadata"].get("deletionTimestamp"):
            grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            self.kill = ("", "", grace, "Error")
        reason, message, grace, container_reason = self.kill or ("", "", 0, "Error")
        if reason:
            # The Pod is Failed (DeadlineExceeded, Evicted) from the moment the kubelet decides to
            # kill it, before its containers end (generateAPIPodStatus applies the sync handlers'
            # verdict in every status it writes).
            self.write(lambda st: st.update(phase="Failed", reason=reason, message=message))
        alive = {n: p for n, p in self.procs.items() if p.returncode is None}
        for name, proc in alive.items():
            self.event("Normal", "Killing", f"Stopping container {name}", name)
            _signal(proc, signal.SIGKILL if grace == 0 else signal.SIGTERM)
        if alive:
            waits = [asyncio.ensure_future(p.wait()) for p in alive.values()]
            _, late = await asyncio.wait(waits, timeout=max(grace, 0) or None if grace else 5)
            for proc in alive.values():
                if proc.returncode is None:
                    _signal(proc, signal.SIGKILL)
            await asyncio.gather(*waits, return_exceptions=True)
            del late
        for name, proc in alive.items():
            _end_container(proc)
            with contextlib.suppress(_Terminate):
                self._record_exit(
                    name,
                    proc.returncode if proc.returncode is not None else -9,
                    container_reason if container_reason != "Error" else None,
                )

    def _finish(self, specs: list[dict[str, Any]]) -> None:
        pod = self.pod()
        if pod is None:
            return
        statuses = pod["status"].get("containerStatuses") or []
        if self.kill and self.kill[0]:
            phase = "Failed"
        elif not any(c["name"] in self.started_at for c in specs) and not any(
            "terminated" in s["state"] for s in statuses
        ):
            return  # never started (deleted while pending or initializing): nothing to report
        else:
            for s in statuses:
                if "terminated" not in s["state"]:
                    s_state = podstatus.terminated(
                        137,
                        "ContainerStatusUnknown",
                        now(),
                        s.get("containerID", ""),
                        "The container could not be located when the pod was terminated",
                    )
                    self.set_container(s["name"], {**s, "state": s_state, "ready": False, "started": False})
            refreshed = self.pod()
            phase = podstatus.phase_after((refreshed or pod)["status"].get("containerStatuses") or [])

        def finished(st: dict[str, Any]) -> None:
            st["phase"] = phase
            podstatus.finished_conditions(st, phase)

        self.write(finished)

    def _remove_if_deleted(self) -> None:
        pod = self.pod()
        if pod is not None and pod["metadata"]["uid"] == self.uid and pod["metadata"].get("deletionTimestamp"):
            with contextlib.suppress(status.ApiError):
                self.kubelet.store.delete(
                    resources.PODS,
                    self.namespace,
                    self.name,
                    {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
                )


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    if sig == signal.SIGKILL:
        _end_container(proc)


def _end_container(proc: asyncio.subprocess.Process) -> None:
    """A container's first process ended (or is killed): kill what is left of the container.
    The double has no PID namespaces; a container's processes are those of its session (each
    container starts one), also those in process groups of their own (an agent's steps), as the
    kernel kills a PID namespace's processes when its init ends."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            session = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3])
        except (OSError, IndexError, ValueError):
            continue
        if session == proc.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


class Kubelet:
    def __init__(
        self, store: Store, node: str, options: KubeletOptions, registry: dict[int, ContainerRef], node_object: Obj
    ) -> None:
        self.store = store
        self.node = node
        self.options = options
        self.registry = registry
        self.recorder = Recorder(store, "kubelet", node)
        self.workers: dict[str, tuple[PodWorker, asyncio.Task[None]]] = {}
        # Pods whose worker ended (restartPolicy Never: never run again), as the kubelet's pod
        # workers remember terminated pods: a stale event of one (a watch behind the
        # kubelet's own writes, against a real API server) must not start it anew.
        self.finished: set[str] = set()
        self.pulled: set[str] = set()
        # emptyDirs live in a short directory of their own: a unix socket's path (an agent's
        # `/__dynrunner/agent.sock`) must fit sun_path's 108 bytes, which a Pod directory under
        # a test's tmp_path does not. Each Pod's are removed when the Pod is deleted.
        self.scratch = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp" if Path("/tmp").is_dir() else None))
        self.empty_dirs: dict[str, list[Path]] = {}
        self._empty_dir_count = 0
        self.lost = False
        self._ips = 1
        self.node_object = node_object

    def pod_ip(self) -> str:
        self._ips += 1
        return f"10.244.{abs(hash(self.node)) % 250}.{self._ips % 250}"

    def secret_lookup(self, namespace: str) -> Callable[[str], dict[str, Any] | None]:
        return lambda name: self.store.peek(resources.SECRETS, namespace, name)

    def materialize(self, pod: Obj, root: Path) -> containers.PathMap:
        """Set up every volume under the Pod's host directory; map each mountPath to it."""
        volumes: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            target = root / "volumes" / name
            if "secret" in volume:
                source = volume["secret"]
                secret = self.store.peek(resources.SECRETS, pod["metadata"]["namespace"], source["secretName"])
                if secret is None:
                    if source.get("optional"):
                        target.mkdir(parents=True, exist_ok=True)
                        volumes[name] = target
                        continue
                    raise containers.MountError(
                        f'MountVolume.SetUp failed for volume "{name}" : secret "{source["secretName"]}" not found'
                    )
                try:
                    containers.write_secret_volume(target, secret, source)
                except containers.MountError as err:
                    raise containers.MountError(f'MountVolume.SetUp failed for volume "{name}" : {err}') from err
            elif "csi" in volume:
                driver = volume["csi"].get("driver", "")
                if driver not in self.options.csi:
                    raise containers.MountError(
                        f'MountVolume.SetUp failed for volume "{name}" : kubernetes.io/csi: '
                        "mounter.SetUpAt failed to get CSI client: "
                        f"driver name {driver} not found in the list of registered CSI drivers"
                    )
                volumes[name] = self.options.csi[driver]
                continue
            elif "hostPath" in volume:
                volumes[name] = Path(volume["hostPath"]["path"])
                continue
            else:
                target = self.empty_dir(pod["metadata"]["uid"], target)
            volumes[name] = target
        paths = containers.PathMap()
        for spec in [*(pod["spec"].get("initContainers") or []), *(pod["spec"].get("containers") or [])]:
            for mount in spec.get("volumeMounts") or []:
                host = volumes[mount["name"]]
                if mount.get("subPath"):
                    host = host / mount["subPath"]
                paths.add(mount["mountPath"], host)
        return paths

    def empty_dir(self, uid: str, link: Path) -> Path:
        """A fresh emptyDir for Pod `uid`, with `link` (its place in the Pod's directory) to it."""
        self._empty_dir_count += 1
        target = self.scratch / str(self._empty_dir_count)
        target.mkdir()
        self.empty_dirs.setdefault(uid, []).append(target)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(target, target_is_directory=True)
        return target

    def drop_empty_dirs(self, uid: str) -> None:
        for path in self.empty_dirs.pop(uid, []):
            shutil.rmtree(path, ignore_errors=True)

    def on_pod(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        entry = self.workers.get(uid)
        if entry is None:
            if pod["status"].get("phase") in ("Succeeded", "Failed") or uid in self.finished:
                return
            worker = PodWorker(self, pod)
            task = asyncio.ensure_future(worker.run())

            def done(_t: asyncio.Task[None]) -> None:
                self.workers.pop(uid, None)
                self.finished.add(uid)

            task.add_done_callback(done)
            self.workers[uid] = (worker, task)
            return
        if pod["metadata"].get("deletionTimestamp"):
            entry[0].stop.set()

    def lose(self, kill: bool = True) -> None:
        """The node disappears: no more status, events or deletes; processes die with it if `kill`."""
        self.lost = True
        for worker, task in list(self.workers.values()):
            if kill:
                for proc in worker.processes():
                    _signal(proc, signal.SIGKILL)
            task.cancel()

    def worker(self, namespace: str, name: str) -> PodWorker:
        for worker, _ in self.workers.values():
            if (worker.namespace, worker.name) == (namespace, name):
                return worker
        raise KeyError(f"no running pod {namespace}/{name} on {self.node}")

    async def run(self) -> None:
        watcher = self.store.watch(resources.PODS, None, lambda o: o["spec"].get("nodeName") == self.node, "0")
        try:
            while not self.lost:
                event = await watcher.queue.get()
                if event is None or isinstance(event, status.ApiError):
                    return
                uid = event.obj["metadata"]["uid"]
                if event.type != "DELETED":
                    self.on_pod(event.obj)
                elif (entry := self.workers.get(uid)) is not None:
                    entry[0].terminate("", "", 0)  # force-deleted: the containers are killed at once
                    entry[1].add_done_callback(lambda _t, uid=uid: self.drop_empty_dirs(uid))  # type: ignore[misc]
                else:
                    self.drop_empty_dirs(uid)
        finally:
            self.store.unwatch(watcher)
            procs = [proc for worker, _ in self.workers.values() for proc in worker.processes()]
            for worker, task in list(self.workers.values()):
                for proc in worker.processes():
                    _signal(proc, signal.SIGKILL)
                task.cancel()
            await asyncio.gather(*(t for _, t in self.workers.values()), return_exceptions=True)
            # Reap what was killed, so no process outlives the double unwaited for.
            waits = [asyncio.ensure_future(p.wait()) for p in procs if p.returncode is None]
            if waits:
                await asyncio.wait(waits, timeout=5)
            shutil.rmtree(self.scratch, ignore_errors=True)
