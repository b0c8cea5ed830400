"""`dynrunner-controller render --config FILE --pool NAME --task FILE`: the Secret, the pull
Secret (for `credentials`), the Pod and the ClusterStaticEntry a kubernetes pool would create
for a task, as YAML, touching no cluster.

The assignment is built as the claimer builds it (the same validation: a job key the contract
refuses is the same error), with placeholders where only a running system knows the value:
the assignment id is all zeros, the runner is `<runner>`, the Secret's data is redacted, and
the entry names `<pod-uid>`, `<node-name>` and `<node-uid>`.

The task file is YAML or JSON: a Gitea task as FetchTask answers it (`{"task": {...}}` or the
task itself) with `id`, `workflowPayload` (the job's workflow as text, or base64 as protobuf
JSON writes bytes), `context` (the `github` context), `secrets` and `vars`.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from dynrunner.controller.backends.kubernetes import builders, services
from dynrunner.controller.backends.kubernetes.config import KubernetesBackendConfig
from dynrunner.controller.claiming.registrations_store import ArmedRegistration
from dynrunner.controller.config.model import ControllerConfig
from dynrunner.proto.assignment import encode
from dynrunner.proto.gitea import Task

PLACEHOLDER_ASSIGNMENT_ID = "00000000-0000-0000-0000-000000000000"
POD_UID, NODE_NAME, NODE_UID = "<pod-uid>", "<node-name>", "<node-uid>"


class RenderError(Exception):
    """The objects cannot be rendered (the message says why)."""


def read_task(path: Path) -> Task:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise RenderError(f"cannot read the task file {path}: {err}") from None
    if isinstance(data, dict) and isinstance(data.get("task"), dict):
        data = data["task"]
    if not isinstance(data, dict):
        raise RenderError(f"{path}: expected a mapping with the task's id, workflowPayload and context")
    payload = data.get("workflowPayload", data.get("workflow_payload"))
    context = data.get("context") or {}
    if not isinstance(context, dict):
        raise RenderError(f"{path}: `context` must be a mapping (the task's github context)")
    try:
        task_id = int(data.get("id") or 1)
    except (TypeError, ValueError):
        raise RenderError(f"{path}: `id` must be a number") from None
    return Task(
        id=task_id,
        workflow_payload=_payload(payload),
        context=context,
        secrets={str(k): str(v) for k, v in (data.get("secrets") or {}).items()},
        vars={str(k): str(v) for k, v in (data.get("vars") or {}).items()},
    )


def _payload(value: Any) -> bytes | None:
    if value is None:
        return None
    text = str(value)
    try:
        decoded = base64.b64decode(text, validate=True)
        if b"jobs" in decoded:
            return decoded
    except (binascii.Error, ValueError):
        pass
    return text.encode()


def render(cfg: ControllerConfig, pool_name: str, task: Task) -> str:
    """The objects as a multi-document YAML stream (raises RenderError, ContractError)."""
    from dynrunner.controller.claiming.claimer import build_assignment
    from dynrunner.controller.startup import claim_settings

    try:
        pool = cfg.pool(pool_name)
    except KeyError:
        names = ", ".join(p.name for p in cfg.pools)
        raise RenderError(f"no pool named {pool_name!r} (pools: {names})") from None
    if not isinstance(pool.backend, KubernetesBackendConfig):
        raise RenderError(f"pool {pool_name} uses the {pool.backend.kind} backend; render shows kubernetes pools")
    settings = builders.PodSettings.from_config(pool, cfg)
    problems = settings.problems()
    if problems:
        raise RenderError("; ".join(problems))
    runner = ArmedRegistration(0, "<runner>", "<redacted>", "<runner>", tuple(pool.labels), datetime.now(UTC))
    assignment = build_assignment(
        task,
        assignment_id=PLACEHOLDER_ASSIGNMENT_ID,
        claimed_at=datetime.now(UTC),
        runner=runner,
        settings=claim_settings(cfg, pool),
    )
    name = f"dr-{PLACEHOLDER_ASSIGNMENT_ID}"
    handed = builders.handed(assignment, settings)
    try:
        found = builders.job_containers(assignment)
        pod = builders.pod(assignment, settings, containers=found)
    except services.ServicesError as err:
        raise RenderError(f"the job's `{err.key}:` cannot run in this pool: {err}") from None
    secret = builders.secret(
        encode(handed),
        name=name,
        namespace=settings.namespace,
        labels=builders.job_labels(assignment),
        env=services.secret_env(found.all),
    )
    size = len(encode(handed))
    secret["data"] = {
        key: f"<redacted: {size} bytes, the job's assignment with its credentials>"
        if key == builders.ASSIGNMENT_KEY
        else "<redacted: an env value made from the job's secrets>"
        for key in secret["data"]
    }
    secret["metadata"]["ownerReferences"] = [builders.owner_reference(name, POD_UID)]
    documents = [secret, pod]
    pull = services.pull_secret(found.all, name=name, namespace=settings.namespace, labels=secret["metadata"]["labels"])
    if pull is not None:
        pull["metadata"]["ownerReferences"] = [builders.owner_reference(name, POD_UID)]
        pull["data"] = {key: "<redacted: the registry logins of the job's `credentials`>" for key in pull["data"]}
        documents.insert(1, pull)
    if settings.backend.identity:
        documents.append(
            builders.cluster_static_entry(assignment, settings, pod_uid=POD_UID, node_name=NODE_NAME, node_uid=NODE_UID)
        )
    return yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False)
