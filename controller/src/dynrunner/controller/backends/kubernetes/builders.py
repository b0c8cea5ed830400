"""The objects of one job, as pure functions of (assignment, pool settings): the Secret with
the assignment, the Pod that runs the executor, and its ClusterStaticEntry (`identity`).

`render` prints exactly these; the backend only sends them. Where things are inside the Pod
(the assignment file, the workspace, the Workload API socket, the termination message file)
reaches the executor through its args, working directory and environment: the assignment
stays backend-neutral.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import yaml

from dynrunner.controller import contract
from dynrunner.controller.backends.kubernetes import identity, job_container, pod_values, services
from dynrunner.controller.backends.kubernetes.config import KubernetesBackendConfig
from dynrunner.controller.backends.kubernetes.diagnosis import (
    AGENT_INSTALL_CONTAINER,
    EXECUTOR_CONTAINER,
    JOB_CONTAINER,
)
from dynrunner.controller.backends.kubernetes.merge import merge
from dynrunner.controller.config.model import ControllerConfig, PoolConfig
from dynrunner.proto.assignment import Assignment, IdentityWait

ASSIGNMENT_VOLUME = "assignment"
ASSIGNMENT_DIR = "/var/run/dynrunner"
ASSIGNMENT_KEY = "assignment.pb"
ASSIGNMENT_FILE_MODE = 0o440
WORKSPACE_VOLUME = "workspace"
DEFAULT_WORKSPACE = "/workspace"
WORKLOAD_API_VOLUME = "spiffe-workload-api"
FS_GROUP = 1001
"""The executor image's `runner` group; with it the (0440, root-owned) assignment file and the
workspace are the job user's whatever uid the image runs as. A pod template may change it."""
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_ENV = "DYNRUNNER_TERMINATION_MESSAGE_PATH"
SPIFFE_ENDPOINT_ENV = "SPIFFE_ENDPOINT_SOCKET"
POD_DEADLINE_EXTRA_S = 60
"""Added to the job's deadline in `activeDeadlineSeconds`: the executor enforces the job's
timeout itself and reports it; the kubelet's deadline is the backstop."""

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclasses.dataclass(frozen=True, slots=True)
class PodSettings:
    """What the builders need of the configuration, derived once per pool."""

    pool: str
    backend: KubernetesBackendConfig
    trust_domain: str
    cluster: str = ""
    parent_id_template: str = "spiffe://{trustDomain}/spire/agent/k8s_psat/{cluster}/{nodeUid}"
    svid_timeout_s: int = 120
    svid_ttl_s: int = 900
    class_name: str = ""
    workspace_path: str = DEFAULT_WORKSPACE
    deadline_grace_s: int = POD_DEADLINE_EXTRA_S

    @classmethod
    def from_config(cls, pool: PoolConfig, config: ControllerConfig) -> PodSettings:
        assert isinstance(pool.backend, KubernetesBackendConfig)
        ident = config.identity
        return cls(
            pool=pool.name,
            backend=pool.backend,
            trust_domain=ident.trust_domain,
            cluster=ident.cluster,
            parent_id_template=ident.parent_id_template,
            svid_timeout_s=ident.svid_timeout_s,
            svid_ttl_s=ident.svid_ttl_s,
            class_name=ident.class_name,
            workspace_path=config.executor.workspace or DEFAULT_WORKSPACE,
        )

    @property
    def namespace(self) -> str:
        return self.backend.namespace

    def problems(self) -> list[str]:
        """What makes this pool unable to issue identities (checked at start and by `check`)."""
        fields = identity.template_fields(self.parent_id_template)
        if self.backend.identity and "cluster" in fields and not self.cluster:
            return [
                "identity.cluster must name the k8s_psat cluster of the SPIRE agents "
                "(identity.parentIdTemplate uses {cluster})"
            ]
        return []


def handed(assignment: Assignment, settings: PodSettings) -> Assignment:
    """The assignment as the executor receives it: waiting for its identity when the pool
    issues one (the socket comes from SPIFFE_ENDPOINT_SOCKET, set in the Pod)."""
    wait = IdentityWait(enabled=settings.backend.identity, timeout_seconds=settings.svid_timeout_s)
    return assignment.replace(executor=dataclasses.replace(assignment.executor, identity=wait))


def job_labels(assignment: Assignment, stream_seq: int | None = None) -> dict[str, str]:
    labels = contract.environment_labels(assignment, stream_seq)
    for key, context_key in ((contract.LABEL_RUN_ID, "run_id"), (contract.LABEL_RUN_NUMBER, "run_number")):
        value = contract.label_value(str(assignment.task.context_get(context_key) or ""))
        if value:
            labels[key] = value
    labels[contract.LABEL_MANAGED_BY] = contract.MANAGED_BY
    return labels


def job_annotations(assignment: Assignment) -> dict[str, str]:
    annotations = {
        contract.ANNOTATION_REPOSITORY: str(assignment.task.context_get("repository") or ""),
        contract.ANNOTATION_WORKFLOW: str(assignment.task.context_get("workflow") or ""),
        contract.ANNOTATION_JOB_NAME: job_name(assignment),
    }
    if assignment.spiffe_id:
        annotations[contract.ANNOTATION_SPIFFE_ID] = assignment.spiffe_id
    return {key: value for key, value in annotations.items() if value}


def job_name(assignment: Assignment) -> str:
    """The job's display name from the single-job workflow Gitea sent (else its key)."""
    payload = assignment.task.workflow_payload
    if payload and b"name:" in payload:
        try:
            doc = yaml.load(payload, Loader=_Loader)  # a safe loader (C or Python)
        except yaml.YAMLError:
            doc = None
        jobs = doc.get("jobs") if isinstance(doc, dict) else None
        job = next(iter(jobs.values())) if isinstance(jobs, dict) and len(jobs) == 1 else None
        name = job.get("name") if isinstance(job, dict) else None
        if isinstance(name, str) and name.strip():
            return name.strip()
    return assignment.job_key


def secret(
    assignment_bytes: bytes,
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The assignment as a Secret the Pod mounts (immutable: nobody rewrites a job's
    credentials, and the kubelet does not watch it). `env` holds the `env:` values of the
    job's containers made from secrets (`pod_values.secret_env`), which they read through
    `secretKeyRef`; the executor mounts only the assignment's key."""
    data = {ASSIGNMENT_KEY: base64.b64encode(assignment_bytes).decode("ascii")}
    data.update({key: base64.b64encode(value.encode()).decode("ascii") for key, value in (env or {}).items()})
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "type": "Opaque",
        "immutable": True,
        "data": data,
    }


def owner_reference(pod_name: str, pod_uid: str) -> dict[str, Any]:
    """The Secret belongs to its Pod: Kubernetes' garbage collector deletes it with the Pod."""
    return {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid, "controller": True}


def active_deadline_seconds(assignment: Assignment, grace_s: int = POD_DEADLINE_EXTRA_S) -> int | None:
    if assignment.deadline is None:
        return None
    return max(1, math.ceil((assignment.deadline - assignment.claimed_at).total_seconds())) + grace_s


def job_containers(assignment: Assignment) -> services.JobContainers:
    """The job's `container:` and `services:` as its Pod runs them, their `${{ }}` evaluated
    (raises `services.ServicesError`). The one place that says how their values are evaluated."""
    return services.job_containers(assignment.task.workflow_payload, pod_values.evaluator(assignment))


def pod(
    assignment: Assignment,
    settings: PodSettings,
    *,
    stream_seq: int | None = None,
    containers: services.JobContainers | None = None,
) -> dict[str, Any]:
    """The job's Pod: the executor, the job container and its agent's init container for a
    job with `container:`, and one native sidecar per service (raises
    `services.ServicesError` for containers that cannot run here). `containers`: the job's,
    when the caller read them already (`job_containers`)."""
    cfg = settings.backend
    found = job_containers(assignment) if containers is None else containers
    name = contract.environment_name(assignment.assignment_id)
    env = [{"name": TERMINATION_MESSAGE_ENV, "value": TERMINATION_MESSAGE_PATH}]
    mounts: list[dict[str, Any]] = [
        {"name": ASSIGNMENT_VOLUME, "mountPath": ASSIGNMENT_DIR, "readOnly": True},
        {"name": WORKSPACE_VOLUME, "mountPath": settings.workspace_path},
    ]
    volumes: list[dict[str, Any]] = [_assignment_volume(name), {"name": WORKSPACE_VOLUME, **cfg.workspace}]
    if cfg.identity:
        env.insert(0, {"name": SPIFFE_ENDPOINT_ENV, "value": f"unix://{cfg.workload_api_socket}"})
        mounts.append({"name": WORKLOAD_API_VOLUME, "mountPath": cfg.workload_api_dir, "readOnly": True})
        volumes.append({"name": WORKLOAD_API_VOLUME, **cfg.workload_api_volume})
    shared_mounts = [dict(m) for m in mounts if m["name"] != ASSIGNMENT_VOLUME]
    container: dict[str, Any] = {
        "name": EXECUTOR_CONTAINER,
        "image": cfg.image,
        "command": list(cfg.executor_command),
        "args": _executor_args(),
        "workingDir": settings.workspace_path,
        "env": env,
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if found.services:
        env.append({"name": services.PROVIDED_ENV, "value": ",".join(s.name for s in found.services)})
    if cfg.image_pull_policy:
        container["imagePullPolicy"] = cfg.image_pull_policy
    if cfg.resources:
        container["resources"] = cfg.resources
    pod_containers: list[dict[str, Any]] = [container]
    init: list[dict[str, Any]] = []
    if found.job is not None:
        job = job_container.job_container(
            found.job, pod_security=cfg.service_pod_security, shared_mounts=shared_mounts, secret_name=name
        )
        env.extend(job_container.executor_env())
        mounts.append(job_container.agent_mount())
        volumes.append(job_container.agent_volume())
        init.append(job_container.agent_install(container, cfg.executor_command))
        pod_containers.append(job)
    init.extend(services.sidecars(found.services, cfg.service_pod_security, secret_name=name))
    volumes.extend(services.named_volumes(found.all))
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "fsGroup": FS_GROUP,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": pod_containers,
        "volumes": volumes,
    }
    if init:
        spec["initContainers"] = init
    if found.services:
        spec["hostAliases"] = services.host_aliases(found.services)
    if any(s.credentials for s in found.all):
        spec["imagePullSecrets"] = [{"name": name + services.PULL_SECRET_SUFFIX}]
    deadline = active_deadline_seconds(assignment, settings.deadline_grace_s)
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    if cfg.service_account_name:
        spec["serviceAccountName"] = cfg.service_account_name
    if cfg.node_selector:
        spec["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        spec["tolerations"] = list(cfg.tolerations)
    generated = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": job_labels(assignment, stream_seq),
            "annotations": job_annotations(assignment),
        },
        "spec": spec,
    }
    merged: dict[str, Any] = merge(generated, cfg.pod_template) if cfg.pod_template else generated
    return _reassert(merged, generated)


def _executor_args() -> list[str]:
    return ["run", "--assignment", f"{ASSIGNMENT_DIR}/{ASSIGNMENT_KEY}"]


def _assignment_volume(secret_name: str) -> dict[str, Any]:
    return {
        "name": ASSIGNMENT_VOLUME,
        "secret": {
            "secretName": secret_name,
            "defaultMode": ASSIGNMENT_FILE_MODE,
            "items": [{"key": ASSIGNMENT_KEY, "path": ASSIGNMENT_KEY}],
        },
    }


def _reassert(pod: dict[str, Any], generated: dict[str, Any]) -> dict[str, Any]:
    """What a pod template cannot change: the names and labels the controller finds the job
    by, `restartPolicy: Never`, how the executor receives its assignment, and how it reaches
    the job container."""
    meta, want = pod["metadata"], generated["metadata"]
    meta["name"], meta["namespace"] = want["name"], want["namespace"]
    meta["labels"] = {**(meta.get("labels") or {}), **want["labels"]}
    meta["annotations"] = {**(meta.get("annotations") or {}), **want["annotations"]}
    spec = pod["spec"]
    spec["restartPolicy"] = "Never"
    assignment_volume = next(v for v in generated["spec"]["volumes"] if v["name"] == ASSIGNMENT_VOLUME)
    spec["volumes"] = [assignment_volume, *(v for v in spec.get("volumes") or [] if v["name"] != ASSIGNMENT_VOLUME)]
    executor = next((c for c in spec.get("containers") or [] if c.get("name") == EXECUTOR_CONTAINER), None)
    if executor is None:
        raise ValueError(f"the pool's podTemplate removes the {EXECUTOR_CONTAINER!r} container")
    executor["args"] = _executor_args()
    mount = {"name": ASSIGNMENT_VOLUME, "mountPath": ASSIGNMENT_DIR, "readOnly": True}
    _keep_mount(executor, mount)
    wanted = next((c for c in generated["spec"]["containers"] if c["name"] == JOB_CONTAINER), None)
    if wanted is None:
        # A template's `job` entry without an image tunes job containers (resources, env):
        # a job without `container:` has none.
        spec["containers"] = [c for c in spec["containers"] if c.get("name") != JOB_CONTAINER or c.get("image")]
    else:
        _reassert_job_container(spec, executor, wanted, generated["spec"])
    return pod


def _keep_mount(container: dict[str, Any], mount: dict[str, Any]) -> None:
    """`mount` among the container's mounts (first, when it had to be put back), and nothing
    else of its volume or at its path."""
    mounts = container.get("volumeMounts") or []
    clashing = [m for m in mounts if m.get("name") == mount["name"] or m.get("mountPath") == mount["mountPath"]]
    if clashing == [mount]:
        return
    container["volumeMounts"] = [mount, *(m for m in mounts if m not in clashing)]


def _reassert_job_container(
    spec: dict[str, Any], executor: dict[str, Any], wanted: dict[str, Any], generated: dict[str, Any]
) -> None:
    """The job container right after the executor, running the agent from the agent's
    volume; the agent's init container first; the executor told where the socket is."""
    containers = spec["containers"]
    job = next(c for c in containers if c.get("name") == JOB_CONTAINER)
    job["image"], job["command"] = wanted["image"], list(wanted["command"])
    job.pop("args", None)
    _keep_mount(job, job_container.agent_mount())
    containers.remove(job)
    containers.insert(containers.index(executor) + 1, job)
    _keep_mount(executor, job_container.agent_mount())
    told = {e["name"]: e for e in job_container.executor_env()}
    executor["env"] = [*(e for e in executor.get("env") or [] if e.get("name") not in told), *told.values()]
    install_wanted = next(c for c in generated["initContainers"] if c["name"] == AGENT_INSTALL_CONTAINER)
    inits = spec.get("initContainers") or []
    install = next((c for c in inits if c.get("name") == AGENT_INSTALL_CONTAINER), None) or install_wanted
    install["command"] = list(install_wanted["command"])
    _keep_mount(install, job_container.agent_mount())
    spec["initContainers"] = [install, *(c for c in inits if c is not install)]
    volume = job_container.agent_volume()
    spec["volumes"] = [*(v for v in spec["volumes"] if v["name"] != volume["name"]), volume]


def cluster_static_entry(
    assignment: Assignment,
    settings: PodSettings,
    *,
    pod_uid: str,
    node_name: str,
    node_uid: str,
    stream_seq: int | None = None,
) -> dict[str, Any]:
    """The job's ClusterStaticEntry, once its Pod has a UID and a node (raises ContractError
    for a job key or repository that cannot be part of a SPIFFE ID)."""
    return identity.cluster_static_entry(
        name=contract.environment_name(assignment.assignment_id),
        spiffe_id=identity.expected_spiffe_id(assignment, settings.trust_domain),
        parent=identity.parent_id(
            settings.parent_id_template,
            trust_domain=settings.trust_domain,
            cluster=settings.cluster,
            node_uid=node_uid,
            node_name=node_name,
        ),
        namespace=settings.namespace,
        pod_name=contract.environment_name(assignment.assignment_id),
        pod_uid=pod_uid,
        container=EXECUTOR_CONTAINER,
        ttl_s=settings.svid_ttl_s,
        labels=job_labels(assignment, stream_seq),
        class_name=settings.class_name,
    )
