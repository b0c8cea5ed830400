"""`${{ }}` in a Pod job's `container:` and `services:` values, evaluated by the controller
(docs/kubernetes.md, "Expressions in `container:` and `services:`").

The controller builds the job container and the service sidecars before the executor runs, so
it evaluates these values itself, with the executor's expression language
(`dynrunner.proto.expressions`) and the contexts GitHub allows there, built from the
assignment: `github` (Gitea's task context), `needs`, `vars`, `secrets`, `matrix` and
`strategy` (the one combination Gitea's jobparser put in the single-job workflow), `inputs`
(a `workflow_dispatch` event's, typed by the declaration) and, where GitHub allows it (`env:`
and `credentials:`), `env` (the workflow's and the job's `env:`). `job` and `runner` are
refused with a reason: they describe an environment that does not exist yet.

A value made from a secret is a `SecretText`: `credentials` go into the per-job pull Secret as
always, and an `env:` value goes into the job's own Secret (`secret_env`), the container
reading it through `secretKeyRef` (`env_entries`), so no secret is written in the Pod spec.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from dynrunner.proto.assignment import Assignment
from dynrunner.proto.containers import SpecError, Text
from dynrunner.proto.expressions import (
    ALLOWED_CONTEXTS,
    EvalEnv,
    ExpressionError,
    interpolate,
    named_values,
)
from dynrunner.proto.expressions.inputs import inputs_context
from dynrunner.proto.masking import Masker

WORKFLOW_ENV = "env"
JOB_ENV = "jobs.<job_id>.env"
SECRET_ENV_PREFIX = "env."
"""Keys of `env:` values made from secrets in the job's Secret: `env.<container>.<NAME>`."""
NOT_YET = ("job", "runner")
"""Contexts GitHub allows in `env:` but that describe the running job, which the controller
cannot know when it builds the Pod."""
_TOKEN_KEYS = ("token", "gitea_runtime_token", "actions_id_token_request_token")
_HIDDEN_CONTEXT_KEYS = ("gitea_runtime_token", "actions_id_token_request_token")
_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]{0,200}$")
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UnevaluableValue(SpecError):
    """A value whose `${{ }}` cannot be evaluated where it stands; the message names the key,
    the value and the reason (the caller adds which container)."""


class SecretText(str):
    """A value made from the job's secrets (or showing one): it never enters the Pod spec."""

    __slots__ = ()


def single_job(payload: bytes | None) -> tuple[dict[Any, Any], dict[Any, Any]] | None:
    """(the workflow, its one job) of the single-job workflow Gitea sent; None when it cannot
    be read (the executor reports a workflow it cannot read)."""
    if not payload:
        return None
    try:
        doc = yaml.load(payload, Loader=_Loader)  # a safe loader (C or Python)
    except yaml.YAMLError:
        return None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    job = next(iter(jobs.values())) if isinstance(jobs, dict) and len(jobs) == 1 else None
    if not isinstance(doc, dict) or not isinstance(job, dict):
        return None
    return doc, job


def evaluator(assignment: Assignment) -> Text:
    """THE callback for `proto.containers.read_job_containers`: `(place, value) -> str` with
    `${{ }}` evaluated where `place` (a key of GitHub's context-availability table) allows;
    raises `SpecError` naming the key and the value on an expression that cannot be evaluated
    there (`UnevaluableValue`, a `SpecError`). A result made from a secret is a `SecretText`."""
    return PodValues.of(assignment).evaluate


class PodValues:
    """The contexts of one job's `container:`/`services:` values, and their evaluation."""

    def __init__(
        self,
        contexts: Mapping[str, Any],
        *,
        secrets: Iterable[str] = (),
        workflow_env: Mapping[str, Any] | None = None,
        job_env: Mapping[str, Any] | None = None,
    ) -> None:
        self.contexts = dict(contexts)
        self._masker = Masker(v for v in secrets if v)
        self._env_raw = (dict(workflow_env or {}), dict(job_env or {}))
        self._env: dict[str, str] | None = None
        self._env_error = ""

    @classmethod
    def of(cls, assignment: Assignment) -> PodValues:
        task = assignment.task
        found = single_job(task.workflow_payload)
        doc, job = found if found is not None else ({}, {})
        github = github_context(task.context or {}, assignment)
        context = task.context or {}
        secret_values = [*task.secrets.values(), assignment.runner.token, *(context.get(k) for k in _TOKEN_KEYS)]
        matrix, strategy = strategy_contexts(job.get("strategy"))
        contexts = {
            "github": github,
            "gitea": github,
            "needs": {k: {"outputs": dict(n.outputs), "result": n.result.word} for k, n in task.needs.items()},
            "vars": dict(task.vars),
            "secrets": dict(task.secrets),
            "matrix": matrix,
            "strategy": strategy,
            "inputs": inputs_context(doc.get("on", doc.get(True)), github),  # YAML 1.1 reads `on:` as true
        }
        return cls(
            contexts,
            secrets=(v for v in secret_values if isinstance(v, str)),
            workflow_env=_mapping(doc.get("env")),
            job_env=_mapping(job.get("env")),
        )

    def evaluate(self, place: str, value: Any) -> str:
        """`value` with its `${{ }}` evaluated at `place` (see `evaluator`)."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if not isinstance(value, str):
            return str(value)
        if "${{" not in value:
            return self._marked(value, made_from_secrets=False)
        allowed = ALLOWED_CONTEXTS[place] - set(NOT_YET)
        try:
            names = named_values(value, EvalEnv(self.contexts, allowed))
            contexts = self.contexts
            if "env" in names:
                contexts = {**contexts, "env": self._env_context(place, value)}
            result = interpolate(value, EvalEnv(contexts, allowed))
        except ExpressionError as err:
            raise UnevaluableValue(f"`{place}`: {value.strip()}: {_explained(err, place)}") from None
        from_env = "env" in names and _shows_secret_env(result, self._env or {})
        return self._marked(result, made_from_secrets="secrets" in names or from_env)

    def _marked(self, text: str, *, made_from_secrets: bool) -> str:
        if made_from_secrets or self._masker.contains_secret(text):
            return SecretText(text)
        return text

    def _env_context(self, place: str, value: str) -> dict[str, str]:
        """The workflow's `env:` then the job's, evaluated once, where GitHub evaluates them
        (neither may name `env`, so their order does not matter)."""
        if self._env is None:
            env: dict[str, str] = {}
            try:
                for where, raw in zip((WORKFLOW_ENV, JOB_ENV), self._env_raw, strict=True):
                    for key, item in raw.items():
                        self._env_error = f"`{where}` {key}"
                        env[str(key)] = self._env_value(where, item)
                self._env_error = ""
            except ExpressionError as err:
                self._env_error = f"{self._env_error}: {err}"
            self._env = env
        if self._env_error:
            raise UnevaluableValue(
                f"`{place}`: {value.strip()} uses `env`, which cannot be evaluated: {self._env_error}"
            )
        return self._env

    def _env_value(self, where: str, item: Any) -> str:
        if not isinstance(item, str) or "${{" not in item:
            return self.evaluate(where, item)
        env = EvalEnv(self.contexts, ALLOWED_CONTEXTS[where])
        result = interpolate(item, env)
        return self._marked(result, made_from_secrets="secrets" in named_values(item, env))


def _shows_secret_env(text: str, env: Mapping[str, str]) -> bool:
    """Whether `text` shows an `env` value that was made from secrets (a piece of a secret,
    e.g. `fromJSON(secrets.X).password`, is no task secret the masker knows)."""
    return any(isinstance(v, SecretText) and v and v in text for v in env.values())


def _explained(err: ExpressionError, place: str) -> str:
    message = str(err)
    for name in NOT_YET:
        if message.startswith(f"Unrecognized named-value: '{name}'") and name in ALLOWED_CONTEXTS[place]:
            return (
                f"{message} (GitHub allows `{name}` here, but a Pod pool builds the job's containers before "
                "the job runs: write the value, or take it from `env`, `vars` or `matrix`)"
            )
    return message


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def github_context(task_context: Mapping[str, Any], assignment: Assignment) -> dict[str, Any]:
    """Gitea's `github` context as the executor completes it (`executor.contexts`), minus
    what only the running executor knows (`workspace`, `event_path`)."""
    github = {k: v for k, v in task_context.items() if k not in _HIDDEN_CONTEXT_KEYS}
    base = assignment.gitea_url.rstrip("/")
    for key in ("action", "action_path", "action_ref", "action_repository", "action_status", "path", "env"):
        github.setdefault(key, "")
    github.update(
        job=github.get("job") or assignment.job_key,
        server_url=base,
        api_url=f"{base}/api/v1",
        graphql_url="",
    )
    github.setdefault("event", {})
    return github


def strategy_contexts(raw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`matrix`, `strategy`): Gitea's jobparser narrows `strategy.matrix` to the job's one
    combination, every key a one-element list (`encodeMatrix`)."""
    strategy = raw if isinstance(raw, Mapping) else {}
    matrix_raw = strategy.get("matrix")
    matrix: dict[str, Any] = {}
    if isinstance(matrix_raw, Mapping):
        for key, values in matrix_raw.items():
            if key not in ("include", "exclude") and isinstance(values, list) and len(values) == 1:
                matrix[str(key)] = values[0]
    if not strategy:
        return matrix, {"fail-fast": True, "job-index": 0, "job-total": 1, "max-parallel": 1}
    total = strategy.get("job-total", 1)
    parallel = strategy.get("max-parallel")
    return matrix, {
        "fail-fast": strategy.get("fail-fast", True),
        "job-index": strategy.get("job-index", 0),
        "job-total": total,
        "max-parallel": parallel if parallel is not None else total,
    }


def secret_env_key(container: str, name: str, index: int) -> str:
    """The key of one secret `env:` value in the job's Secret (a Secret key allows only
    `[-._a-zA-Z0-9]`; a name outside that, or one that could read as an index, uses its index)."""
    return f"{SECRET_ENV_PREFIX}{container}.{name if _SECRET_KEY_RE.fullmatch(name) else index}"


def env_entries(container: str, env: Mapping[str, str], *, secret_name: str) -> list[dict[str, Any]]:
    """A container's `env` for the Pod spec: plain values as written, values made from
    secrets as `secretKeyRef`s into the job's Secret (`secret_name`, the Pod's own)."""
    entries: list[dict[str, Any]] = []
    for index, (name, value) in enumerate(env.items()):
        if isinstance(value, SecretText):
            ref = {"name": secret_name, "key": secret_env_key(container, name, index)}
            entries.append({"name": name, "valueFrom": {"secretKeyRef": ref}})
        else:
            entries.append({"name": name, "value": value})
    return entries


def secret_env(containers: Iterable[tuple[str, Mapping[str, str]]]) -> dict[str, str]:
    """The `env:` values made from secrets of the given (container name, env) pairs, by the
    keys `env_entries` refers to: data for the job's Secret."""
    return {
        secret_env_key(container, name, index): str(value)
        for container, env in containers
        for index, (name, value) in enumerate(env.items())
        if isinstance(value, SecretText)
    }
