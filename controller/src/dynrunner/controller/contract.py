"""Contract strings in one place: environment labels, names derived from ids, the job-key
rule and the SPIFFE ID builder (DESIGN §6).

Everything here is a pure function of its arguments, so the claimer, every backend and the
reaper agree on the same spelling, and unit tests pin it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dynrunner.proto.assignment import JOB_KEY_RE, Assignment
from dynrunner.proto.gitea import Task

LABEL_PREFIX = "dynrunner.io/"
LABEL_ASSIGNMENT_ID = "dynrunner.io/assignment-id"
LABEL_TASK_ID = "dynrunner.io/task-id"
LABEL_POOL = "dynrunner.io/pool"
LABEL_REPOSITORY = "dynrunner.io/repository"
LABEL_JOB_KEY = "dynrunner.io/job-key"
LABEL_STREAM_SEQ = "dynrunner.io/stream-seq"
"""The JetStream stream sequence of the assignment message the environment was made for: the
reaper asks the stream whether that message is still unacknowledged (a launch interrupted
between creating the environment and acknowledging, whose redelivery will resume it)."""

LABEL_RUN_ID = "dynrunner.io/run-id"
LABEL_RUN_NUMBER = "dynrunner.io/run-number"
"""Gitea's run id and number (`github.run_id`, `github.run_number`), for cost attribution."""
ANNOTATION_REPOSITORY = "dynrunner.io/repository"
ANNOTATION_WORKFLOW = "dynrunner.io/workflow"
ANNOTATION_JOB_NAME = "dynrunner.io/job-name"
ANNOTATION_SPIFFE_ID = "dynrunner.io/spiffe-id"
"""Annotations carry what a label value cannot (any length, any character): the repository as
Gitea spells it, the workflow file, the job's display name, the job's SPIFFE ID."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "dynrunner"

ENVIRONMENT_NAME_PREFIX = "dr-"
LABEL_VALUE_MAX = 63

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")
_SPIFFE_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+$")
_TRUST_DOMAIN = re.compile(r"^[a-z0-9._-]+$")


class ContractError(ValueError):
    """A task cannot be run under the contract (the message is written to its job log)."""


def environment_name(assignment_id: str) -> str:
    """The name of the environment that runs `assignment_id` (a Pod, sandbox or directory).

    `dr-` + a UUID is 39 characters: a valid DNS label and Kubernetes object name.
    """
    return ENVIRONMENT_NAME_PREFIX + assignment_id


def runner_name(prefix: str, pool: str, suffix: str) -> str:
    """The display name of an ephemeral runner registration (Gitea shows it on the job)."""
    return f"{prefix}-{pool}-{suffix}"


def label_value(value: str) -> str:
    """`value` as a valid Kubernetes label value: ≤ 63 characters of [A-Za-z0-9_.-],
    starting and ending with an alphanumeric (other characters become `_`)."""
    cleaned = _LABEL_VALUE_BAD.sub("_", value)[:LABEL_VALUE_MAX]
    return cleaned.strip("_.-")


def _github(context: Mapping[str, Any] | Task | None, key: str) -> Any:
    """A top-level value of a task's github context; from a Task without decoding the rest."""
    if isinstance(context, Task):
        return context.context_get(key)
    return (context or {}).get(key)


def job_key_of(context: Mapping[str, Any] | Task | None) -> str:
    """The workflow job id (`github.job`) of a task, checked against the job-key rule."""
    job = _github(context, "job")
    if not isinstance(job, str) or not job:
        raise ContractError("the task's github context has no job id (`github.job`); it cannot be run")
    if not JOB_KEY_RE.fullmatch(job):
        raise ContractError(
            f"job id {job!r} is not a valid job key: it must match [A-Za-z_][A-Za-z0-9_-]* "
            "(a letter or underscore, then letters, digits, '_' or '-'); rename the job in the workflow"
        )
    return job


def repository_of(context: Mapping[str, Any] | Task | None) -> tuple[str, str]:
    """(owner, repository name) from the task's github context, lowercased."""
    full = _github(context, "repository")
    if not isinstance(full, str) or full.count("/") != 1:
        raise ContractError(f"the task's github context has no usable repository (got {full!r})")
    owner, name = full.lower().split("/")
    if not owner or not name:
        raise ContractError(f"the task's github context has no usable repository (got {full!r})")
    return owner, name


def spiffe_id(trust_domain: str, owner: str, repository: str, job_key: str, ref: str | None = None) -> str:
    """`spiffe://<td>/ci/<owner>/<repository>/<job-key>`; owner and repository lowercased.
    With `ref` (a pool with `refInSpiffeId`), the git ref follows: `…/<job-key>/refs/heads/main`.

    Only the workflow job id enters the ID: never the display name, Gitea's numeric ids or
    the assignment id, so resource owners can authorize a job by what its author wrote.
    """
    if not _TRUST_DOMAIN.fullmatch(trust_domain):
        raise ContractError(f"trust domain {trust_domain!r} must be lowercase letters, digits, '.', '-' or '_'")
    if not JOB_KEY_RE.fullmatch(job_key):
        raise ContractError(f"job key {job_key!r} must match [A-Za-z_][A-Za-z0-9_-]*")
    segments = [owner.lower(), repository.lower()]
    for segment in segments:
        if segment in (".", "..") or not _SPIFFE_SEGMENT.fullmatch(segment):
            raise ContractError(
                f"{segment!r} cannot be part of a SPIFFE ID: only letters, digits, '.', '-' and '_' are allowed"
            )
    base = f"spiffe://{trust_domain}/ci/{segments[0]}/{segments[1]}/{job_key}"
    full = base if ref is None else f"{base}/{ref_path(ref)}"
    if len(full.encode()) > MAX_SPIFFE_ID:
        raise ContractError(f"the job's SPIFFE ID would be longer than {MAX_SPIFFE_ID} bytes (its git ref is too long)")
    return full


MAX_SPIFFE_ID = 2048
"""The SPIFFE standard's limit on a whole ID, in bytes."""


def ref_path(ref: str) -> str:
    """A git ref as SPIFFE ID path segments, one per `/`-separated component, readable as
    written when it uses only letters, digits, '.' and '-' (`refs/heads/main`,
    `refs/tags/v1.2.3`, `refs/pull/7/head`); any other byte, `_` included, becomes `_` and two
    lowercase hex digits (`feature_x` → `feature_5fx`). Every `_` starts an escape, so two refs
    never share a path: a trust policy that matches the whole ID exactly matches one ref."""
    if not ref.startswith("refs/"):
        raise ContractError(f"the task's git ref {ref!r} is not a full ref (refs/...); it cannot name an identity")
    segments = []
    for component in ref.split("/"):
        if component in ("", ".", ".."):
            raise ContractError(f"the task's git ref {ref!r} has an empty, '.' or '..' component")
        segments.append(
            "".join(chr(b) if _REF_KEPT.fullmatch(chr(b)) else f"_{b:02x}" for b in component.encode("utf-8"))
        )
    return "/".join(segments)


_REF_KEPT = re.compile(r"[A-Za-z0-9.-]")


def ref_of(context: Mapping[str, Any] | Task | None) -> str:
    """The task's git ref (`github.ref`), for an identity that carries it."""
    ref = _github(context, "ref")
    if not isinstance(ref, str) or not ref:
        raise ContractError("the task's github context has no git ref (`github.ref`), which this pool's identity names")
    return ref


def environment_labels(assignment: Assignment, stream_seq: int | None = None) -> dict[str, str]:
    """The labels every environment carries (DESIGN §6), plus the stream sequence of the
    assignment's message when the launcher knows it; values are valid label values."""
    owner, name = repository_of(assignment.task)
    labels = {
        LABEL_ASSIGNMENT_ID: assignment.assignment_id,
        LABEL_TASK_ID: str(assignment.task.id),
        LABEL_POOL: assignment.pool,
        LABEL_REPOSITORY: label_value(f"{owner}.{name}"),
        LABEL_JOB_KEY: label_value(assignment.job_key),
    }
    if stream_seq is not None:
        labels[LABEL_STREAM_SEQ] = str(stream_seq)
    return labels
