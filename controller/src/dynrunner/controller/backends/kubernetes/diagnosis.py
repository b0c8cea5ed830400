"""What a job's Pod says, in the user's words: a pure classifier from the Pod's status (and
the Warning events only events carry, such as FailedMount) to an `Observation` — its phase,
and for a Pod that ended or can never run without its executor finalizing the task, a
`Diagnosis` from the closed set of `FailureReason`s.

The executor container decides: exit 0 means it finalized the task (whatever the Pod's
phase, which a sidecar or the job container can hold at Running). The Pod's own reasons (evicted, deadline,
deleted by someone else, node lost) come before the container's exit status, because the
kubelet's SIGTERM/SIGKILL is only their consequence. Waiting states are failures only when
they cannot resolve (an invalid image name, a container that cannot be configured) or have
lasted too long (image pull errors: `imagePullTimeoutSeconds`; unschedulable, volumes that
cannot be mounted, a sandbox that cannot be created: `startTimeoutSeconds`).

The executor's termination message is the task state Gitea last accepted from it
(`dynrunner.proto.accepted`), which a failed Pod's observation carries as `reported` (the
reaper gives each step its final state from it); only a message that holds no state — the
log's tail the kubelet puts there when the executor wrote nothing (FallbackToLogsOnError) — is
the diagnosis' evidence.

The Pod's other containers speak only when they stop the job: a service that will not
become healthy, the agent's init container that failed, a job container (`container:`) that
cannot start or whose agent died while the executor waits for it or runs steps through it
(its image cannot be pulled, it cannot be created, it ended with a status other than the
0 of the agent's `shutdown`). One classifier, read top to bottom, with one closed set of
verdicts: hence one module past the usual size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from dynrunner.controller.backends.base import Diagnosis, FailureReason, Observation, Phase
from dynrunner.proto import accepted

EXECUTOR_CONTAINER = "executor"
JOB_CONTAINER = "job"
"""The job's `container:` (docs/kubernetes.md, "Job containers")."""
AGENT_INSTALL_CONTAINER = "dynrunner-agent-install"
"""The init container that puts the agent (and Node) where the job container finds them."""
PULL_ERRORS = (
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "RegistryUnavailable",
    "SignatureValidationFailed",
)
FATAL_WAITING = ("InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError")
NEVER_RAN = ("StartError", "ContainerCannotRun")
"""Terminated reasons of a container whose process never started."""
START_PROBLEM_EVENTS = ("FailedMount", "FailedAttachVolume", "FailedCreatePodSandBox", "FailedCreatePodContainer")


@dataclass(frozen=True, slots=True)
class PodFacts:
    pod: Mapping[str, Any] | None
    """The Pod as last seen (for a deleted Pod: its final state, from the watch)."""
    now: datetime
    gone: bool = False
    """The object no longer exists."""
    deleted_by_us: bool = False
    events: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    """Warning events about this Pod, oldest first."""
    image_pull_timeout: timedelta = timedelta(minutes=5)
    start_timeout: timedelta = timedelta(minutes=10)


KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "labels")
KEPT_STATUS = ("phase", "reason", "message", "startTime", "conditions")


def essentials(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the backend reads of a Pod (this classifier, the start lines, finding and the
    identity entry): the Pods of a pool are kept in memory as this, not whole (a Pod from a
    real API server carries managedFields, the full spec and every container's image IDs:
    several times the size)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    containers = [
        {key: c[key] for key in ("name", "image", "resources") if key in c} for c in spec.get("containers") or []
    ]
    statuses = [{key: c[key] for key in ("name", "state") if key in c} for c in status.get("containerStatuses") or []]
    kept_spec = {key: spec[key] for key in ("nodeName", "activeDeadlineSeconds") if key in spec}
    kept_status = {key: status[key] for key in KEPT_STATUS if key in status}
    found = {
        "metadata": {key: meta[key] for key in KEPT_METADATA if key in meta},
        "spec": {**kept_spec, "containers": containers},
        "status": {**kept_status, "containerStatuses": statuses},
    }
    sidecars = [
        {key: c[key] for key in ("name", "image", "restartPolicy") if key in c}
        for c in spec.get("initContainers") or []
        if c.get("restartPolicy") == "Always" or c.get("name") == AGENT_INSTALL_CONTAINER
    ]
    if sidecars:
        names = {c.get("name") for c in sidecars}
        found["spec"]["initContainers"] = sidecars
        found["status"]["initContainerStatuses"] = [
            {key: c[key] for key in ("name", "state", "lastState", "restartCount", "started") if key in c}
            for c in status.get("initContainerStatuses") or []
            if c.get("name") in names
        ]
    return found


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def executor_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == EXECUTOR_CONTAINER), {})


def executor_ran(pod: Mapping[str, Any]) -> bool:
    """The executor container runs or ran (it took the job over): not one that could not be
    started at all."""
    state = executor_status(pod).get("state") or {}
    terminated = state.get("terminated")
    if terminated is not None:
        return terminated.get("reason") not in NEVER_RAN
    return "running" in state


def condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), {})


def classify(facts: PodFacts) -> Observation:
    pod = facts.pod
    if pod is None:
        return Observation(Phase.GONE, Diagnosis(FailureReason.VANISHED, "the job's Pod disappeared"))
    state = executor_status(pod).get("state") or {}
    terminated = state.get("terminated")
    ready_at = parse_time((state.get("running") or terminated or {}).get("startedAt"))
    if terminated is not None and terminated.get("exitCode") == 0:
        return Observation(Phase.SUCCEEDED, exit_code=0, ready_at=ready_at, identity_wait_s=_identity_wait(terminated))
    reported = accepted.decode(str(terminated.get("message") or "")) if terminated else None
    ended = _pod_ended(facts)
    if ended is not None:
        code = terminated.get("exitCode") if terminated else None
        return Observation(Phase.FAILED, ended, exit_code=code, ready_at=ready_at, reported=reported)
    if terminated is not None:
        diagnosis = _exit(pod, terminated, facts.deleted_by_us, evidence=reported is None)
        return Observation(Phase.FAILED, diagnosis, terminated.get("exitCode"), ready_at, reported=reported)
    if facts.gone:
        return Observation(Phase.FAILED, _removed(facts), ready_at=ready_at)
    if "running" in state:
        stuck = _job_container_problem(facts)
        if stuck is not None:
            return Observation(Phase.FAILED, stuck, ready_at=ready_at)
        return Observation(Phase.RUNNING, ready_at=ready_at)
    stuck = (
        _agent_install_problem(pod)
        or _service_problem(facts)
        or _job_container_problem(facts)
        or _not_starting(facts, _executor_waiting(pod))
    )
    if stuck is not None:
        return Observation(Phase.FAILED, stuck)
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Failed", "Succeeded"):
        return Observation(
            Phase.FAILED,
            Diagnosis(FailureReason.START_FAILED, f"the job's Pod ended ({phase}) before its executor ran"),
        )
    return Observation(Phase.STARTING)


def _identity_wait(terminated: Mapping[str, Any]) -> float | None:
    """The executor's `{"identityWaitSeconds": x}` termination message, written once it
    finalized its task (docs/kubernetes.md, "The wait's duration")."""
    try:
        said = json.loads(str(terminated.get("message") or ""))
    except ValueError:
        return None
    wait = said.get("identityWaitSeconds") if isinstance(said, dict) else None
    return float(wait) if isinstance(wait, int | float) and not isinstance(wait, bool) and wait >= 0 else None


def _pod_ended(facts: PodFacts) -> Diagnosis | None:
    """Reasons of the Pod itself: they explain a container killed as their consequence."""
    pod = facts.pod
    assert pod is not None
    status = pod.get("status") or {}
    reason, message = status.get("reason"), str(status.get("message") or "")
    if status.get("phase") == "Failed" and reason == "Evicted":
        return Diagnosis(FailureReason.EVICTED, f"the job's Pod was evicted by its node: {message}".rstrip(": "))
    if status.get("phase") == "Failed" and reason == "DeadlineExceeded":
        limit = (pod.get("spec") or {}).get("activeDeadlineSeconds")
        return Diagnosis(
            FailureReason.DEADLINE_EXCEEDED,
            f"the job's Pod ran longer than its deadline ({limit}s: the job's timeout plus a grace period) "
            "and Kubernetes stopped it",
        )
    if status.get("phase") == "Failed" and reason in (
        "NodeLost",
        "UnexpectedAdmissionError",
        "OutOfcpu",
        "OutOfmemory",
    ):
        return Diagnosis(FailureReason.VANISHED, f"the job's Pod failed on its node ({reason}): {message}".rstrip(": "))
    disruption = condition(pod, "DisruptionTarget")
    deleting = facts.gone or (pod.get("metadata") or {}).get("deletionTimestamp")
    if disruption.get("status") == "True" and deleting and not facts.deleted_by_us:
        return _disrupted(pod, disruption)
    return None


def _disrupted(pod: Mapping[str, Any], disruption: Mapping[str, Any]) -> Diagnosis:
    node = (pod.get("spec") or {}).get("nodeName") or "its node"
    reason = disruption.get("reason")
    if reason == "DeletionByTaintManager":
        return Diagnosis(
            FailureReason.VANISHED,
            f"the node {node} running the job stopped responding (node lost); Kubernetes deleted the job's Pod",
        )
    if reason == "PreemptionByScheduler":
        return Diagnosis(FailureReason.EVICTED, "the job's Pod was preempted by a Pod of higher priority")
    if reason == "EvictionByEvictionAPI":
        return Diagnosis(FailureReason.EVICTED, f"the job's Pod was evicted from {node} (a node drain?)")
    message = disruption.get("message") or reason or "disrupted"
    return Diagnosis(FailureReason.EVICTED, f"the job's Pod was disrupted on {node}: {message}")


def _removed(facts: PodFacts) -> Diagnosis:
    if facts.deleted_by_us:
        return Diagnosis(FailureReason.VANISHED, "the job's Pod was deleted before its executor finished")
    return Diagnosis(
        FailureReason.VANISHED,
        "the job's Pod was deleted by someone other than the controller before the job finished",
    )


def _exit(pod: Mapping[str, Any], terminated: Mapping[str, Any], deleted_by_us: bool, *, evidence: bool) -> Diagnosis:
    """`evidence`: the termination message is the log's tail, not the executor's state."""
    code = terminated.get("exitCode")
    reason = terminated.get("reason") or ""
    detail = str(terminated.get("message") or "") if evidence else ""
    if reason == "OOMKilled":
        limit = _memory_limit(pod)
        within = f" (memory limit {limit})" if limit else ""
        return Diagnosis(
            FailureReason.OUT_OF_MEMORY, f"the job ran out of memory{within}: the executor was OOMKilled", detail
        )
    if reason in NEVER_RAN:
        return Diagnosis(FailureReason.START_FAILED, f"the executor could not be started: {detail}")
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    if deleting and not deleted_by_us:
        return Diagnosis(
            FailureReason.VANISHED,
            f"the job's Pod was deleted by someone other than the controller; the executor exited with status {code}",
            detail,
        )
    if isinstance(code, int) and code > 128:
        return Diagnosis(FailureReason.KILLED, f"the executor was killed by signal {code - 128} (exit {code})", detail)
    return Diagnosis(
        FailureReason.EXECUTOR_FAILED,
        f"the executor exited with status {code} before it reported the job's result",
        detail,
    )


def _memory_limit(pod: Mapping[str, Any], name: str = EXECUTOR_CONTAINER) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == name:
            return str(((container.get("resources") or {}).get("limits") or {}).get("memory") or "")
    return ""


def _not_starting(facts: PodFacts, waiting: Mapping[str, Any]) -> Diagnosis | None:
    """A Pod that will not start by itself: fatal at once, or after its time-out."""
    pod = facts.pod
    assert pod is not None
    reason, message = waiting.get("reason") or "", str(waiting.get("message") or "")
    image = _executor_image(pod)
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp")) or facts.now
    started = parse_time((pod.get("status") or {}).get("startTime")) or created
    if reason == "InvalidImageName":
        return Diagnosis(FailureReason.START_FAILED, f"the executor image name {image!r} is invalid: {message}")
    if reason in FATAL_WAITING:
        return Diagnosis(
            FailureReason.START_FAILED, f"the executor's container could not be created ({reason}): {message}"
        )
    if reason in PULL_ERRORS and facts.now - started >= facts.image_pull_timeout:
        return Diagnosis(
            FailureReason.START_FAILED,
            f"the executor image {image} could not be pulled ({reason}; gave up after "
            f"{_seconds(facts.image_pull_timeout)}): {message}".rstrip(": "),
        )
    scheduled = condition(pod, "PodScheduled")
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        if facts.now - created >= facts.start_timeout:
            return Diagnosis(
                FailureReason.UNSCHEDULABLE,
                f"no node could run the job's Pod within {_seconds(facts.start_timeout)}: "
                f"{scheduled.get('message') or 'unschedulable'}",
            )
        return None
    problem = next((e for e in reversed(facts.events) if e.get("reason") in START_PROBLEM_EVENTS), None)
    if problem is not None and facts.now - started >= facts.start_timeout:
        return Diagnosis(
            FailureReason.START_FAILED,
            f"the job's Pod could not start within {_seconds(facts.start_timeout)} "
            f"({problem.get('reason')}): {problem.get('message')}",
        )
    return None


def service_statuses(pod: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """The job's services (native sidecars: init containers with `restartPolicy: Always`)
    with their statuses ({} before the kubelet reports one)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = {s.get("name"): s for s in status.get("initContainerStatuses") or []}
    return [
        (c, statuses.get(c.get("name"), {}))
        for c in spec.get("initContainers") or []
        if c.get("restartPolicy") == "Always"
    ]


def _service_problem(facts: PodFacts) -> Diagnosis | None:
    """A service that will not become healthy before the executor starts: one that exited or
    was restarted (its startup probe failed for its whole budget, or it stopped by itself: a
    sidecar is restarted, the job is not held for it), one whose container cannot be created
    (an image that runs as root under `runAsNonRoot`), or whose image cannot be pulled."""
    pod = facts.pod
    assert pod is not None
    started = parse_time((pod.get("status") or {}).get("startTime")) or facts.now
    for container, status in service_statuses(pod):
        name = str(container.get("name") or "")
        state = status.get("state") or {}
        terminated = state.get("terminated") or (status.get("lastState") or {}).get("terminated")
        if terminated is not None or (status.get("restartCount") or 0) > 0:
            last = terminated or {}
            probe = _probe_failure(facts.events, name)
            if probe:
                reason = f"its startup probe (`--health-cmd`) kept failing: {probe}"
            else:
                reason = f"it exited with status {last.get('exitCode')} ({last.get('reason') or 'no reason given'})"
            output = str(last.get("message") or "").rstrip()
            if output:
                detail = output
            elif last.get("exitCode") == 0:
                detail = (
                    "The service's output is not known: it exited with status 0 when stopped, and the kubelet "
                    "keeps a container's last output (FallbackToLogsOnError) only after a failed exit."
                )
            else:
                detail = "The service wrote no output."
            heading = f"last lines of service '{name}' output:" if output else f"service '{name}' output:"
            return Diagnosis(FailureReason.START_FAILED, f"Service '{name}' is unhealthy: {reason}", detail, heading)
        waiting = state.get("waiting") or {}
        reason, message = waiting.get("reason") or "", str(waiting.get("message") or "")
        image = container.get("image") or ""
        if reason in FATAL_WAITING:
            hint = ""
            if "runAsNonRoot" in message:
                hint = (
                    " (the image starts as root: give the service a numeric `--user` in `options`, or run the "
                    "job in a pool with `servicePodSecurity: baseline`, docs/kubernetes.md)"
                )
            return Diagnosis(
                FailureReason.START_FAILED,
                f"Service '{name}' could not be started ({reason}): {message}{hint}".rstrip(": "),
            )
        if reason in PULL_ERRORS and facts.now - started >= facts.image_pull_timeout:
            return Diagnosis(
                FailureReason.START_FAILED,
                f"the image {image} of service '{name}' could not be pulled ({reason}; gave up after "
                f"{_seconds(facts.image_pull_timeout)}): {message}".rstrip(": "),
            )
    return None


def _probe_failure(events: Sequence[Mapping[str, Any]], container: str) -> str:
    """The kubelet's last `Unhealthy` event about this container's startup probe (its output)."""
    for event in reversed(events):
        if event.get("reason") == "Unhealthy" and str(event.get("fieldPath") or "").endswith(f"{{{container}}}"):
            return str(event.get("message") or "").strip()
    return ""


def _executor_waiting(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """Why the executor is not running yet. Its image is pulled for the agent's init
    container first, when the job has one: the executor then waits `PodInitializing`, and the
    init container's waiting says why."""
    waiting = (executor_status(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in (None, "", "PodInitializing"):
        install = _status(pod, "initContainerStatuses", AGENT_INSTALL_CONTAINER)
        return (install.get("state") or {}).get("waiting") or waiting
    return waiting


def _status(pod: Mapping[str, Any], kind: str, name: str) -> Mapping[str, Any]:
    return next((s for s in (pod.get("status") or {}).get(kind) or [] if s.get("name") == name), {})


def _agent_install_problem(pod: Mapping[str, Any]) -> Diagnosis | None:
    """The init container that stages the job container's agent failed (with `restartPolicy:
    Never` the Pod then fails, and the executor never starts): the executor image lacks the
    agent or Node, most likely."""
    terminated = (_status(pod, "initContainerStatuses", AGENT_INSTALL_CONTAINER).get("state") or {}).get("terminated")
    if not terminated or terminated.get("exitCode") == 0:
        return None
    output = str(terminated.get("message") or "").rstrip()
    return Diagnosis(
        FailureReason.START_FAILED,
        f"the agent for the job container could not be installed: {AGENT_INSTALL_CONTAINER} (the executor image "
        f"{_executor_image(pod)}) exited with status {terminated.get('exitCode')} "
        f"({terminated.get('reason') or 'no reason given'}); the executor image must carry dynrunner-agent "
        "(images/executor.Containerfile)",
        output,
        f"last lines of {AGENT_INSTALL_CONTAINER} output:",
    )


def job_container_waits(pod: Mapping[str, Any]) -> bool:
    """The Pod has a job container that is not running yet (a verdict may come by time alone)."""
    spec = next((c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == JOB_CONTAINER), None)
    return spec is not None and "waiting" in (_status(pod, "containerStatuses", JOB_CONTAINER).get("state") or {})


def _job_container_problem(facts: PodFacts) -> Diagnosis | None:
    """A job container (`container:`) that will not run the job's steps: its image cannot be
    pulled (after `imagePullTimeoutSeconds`) or named, it cannot be created (an image that
    starts as root under `runAsNonRoot`), or it ended with a status other than 0 (the agent's
    answer to `shutdown`) while the executor had not: its agent is gone, and the executor,
    waiting for it or running steps through it, cannot say why."""
    pod = facts.pod
    assert pod is not None
    container = next(
        (c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == JOB_CONTAINER), None
    )
    if container is None:
        return None
    image = str(container.get("image") or "")
    state = _status(pod, "containerStatuses", JOB_CONTAINER).get("state") or {}
    terminated = state.get("terminated")
    if terminated is not None:
        if terminated.get("exitCode") == 0:
            return None
        reason, code = terminated.get("reason") or "", terminated.get("exitCode")
        output = str(terminated.get("message") or "").rstrip()
        if reason == "OOMKilled":
            limit = _memory_limit(pod, JOB_CONTAINER)
            within = f" (memory limit {limit})" if limit else ""
            message = f"the job container (image {image}) ran out of memory{within} and was OOMKilled"
            return Diagnosis(FailureReason.OUT_OF_MEMORY, message, output, "last lines of the job container's output:")
        if reason in NEVER_RAN:
            message = f"the job container (image {image}) could not be started ({reason})"
        else:
            message = (
                f"the job container (image {image}) ended with status {code} ({reason or 'no reason given'}) "
                "before the job did: the runner's agent in it is gone"
            )
        return Diagnosis(FailureReason.START_FAILED, message, output, "last lines of the job container's output:")
    waiting = state.get("waiting") or {}
    reason, said = waiting.get("reason") or "", str(waiting.get("message") or "")
    if reason == "InvalidImageName":
        return Diagnosis(FailureReason.START_FAILED, f"the job container's image name {image!r} is invalid: {said}")
    if reason in FATAL_WAITING:
        hint = ""
        if "runAsNonRoot" in said or "non-root" in said:
            hint = (
                " (the image starts as root: give `container:` a numeric `--user` in `options`, or run the job in a "
                "pool with `servicePodSecurity: baseline`, docs/kubernetes.md)"
            )
        return Diagnosis(
            FailureReason.START_FAILED,
            f"the job container (image {image}) could not be started ({reason}): {said}{hint}".rstrip(": "),
        )
    started = parse_time((pod.get("status") or {}).get("startTime")) or facts.now
    if reason in PULL_ERRORS and facts.now - started >= facts.image_pull_timeout:
        return Diagnosis(
            FailureReason.START_FAILED,
            f"the image {image} of the job container could not be pulled ({reason}; gave up after "
            f"{_seconds(facts.image_pull_timeout)}): {said}".rstrip(": "),
        )
    return None


def waiting_line(pod: Mapping[str, Any]) -> str:
    """Why the executor is not running yet, for a stage line ("" when nothing is wrong)."""
    waiting = _executor_waiting(pod)
    reason, message = waiting.get("reason") or "", waiting.get("message") or ""
    if reason in PULL_ERRORS:
        return f"the executor image {_executor_image(pod)} cannot be pulled yet ({reason}): {message}".rstrip(": ")
    scheduled = condition(pod, "PodScheduled")
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return f"waiting for a node: {scheduled.get('message') or 'unschedulable'}"
    return ""


def _executor_image(pod: Mapping[str, Any]) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == EXECUTOR_CONTAINER:
            return str(container.get("image") or "")
    return ""


def _seconds(delta: timedelta) -> str:
    return f"{int(delta.total_seconds())}s"
