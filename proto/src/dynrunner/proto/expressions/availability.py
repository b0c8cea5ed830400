"""Which contexts and special functions each workflow key may use.

From GitHub's "Contexts → Context availability" table. Gitea serves its `gitea` context
wherever `github` is available (it is the same object), so `gitea` is listed with it.
Pass a row as `EvalEnv.allowed`: context names and special-function names are matched
ignoring case.
"""

from __future__ import annotations

_STATUS = ("always", "cancelled", "success", "failure")
_WORKFLOW = ("github", "gitea", "inputs", "vars")
_JOB = (*_WORKFLOW, "needs", "strategy", "matrix")
_STEP = (*_JOB, "job", "runner", "env", "secrets", "steps")
# An action's metadata (actions/runner's action schema): no `secrets`, `vars` or `needs`.
_ACTION = ("github", "gitea", "inputs", "strategy", "matrix", "steps", "job", "runner", "env")


def _row(*names: str) -> frozenset[str]:
    return frozenset(names)


ALLOWED_CONTEXTS: dict[str, frozenset[str]] = {
    "run-name": _row(*_WORKFLOW),
    "concurrency": _row(*_WORKFLOW),
    "env": _row(*_WORKFLOW, "secrets"),
    "on.workflow_call.inputs.<inputs_id>.default": _row(*_WORKFLOW),
    "on.workflow_call.outputs.<output_id>.value": _row(*_WORKFLOW, "jobs"),
    "jobs.<job_id>.concurrency": _row(*_JOB),
    "jobs.<job_id>.container": _row(*_JOB),
    "jobs.<job_id>.container.credentials": _row(*_JOB, "env", "secrets"),
    "jobs.<job_id>.container.env.<env_id>": _row(*_JOB, "job", "runner", "env", "secrets"),
    "jobs.<job_id>.container.image": _row(*_JOB),
    "jobs.<job_id>.continue-on-error": _row(*_JOB),
    "jobs.<job_id>.defaults.run": _row(*_JOB, "env"),
    "jobs.<job_id>.env": _row(*_JOB, "secrets"),
    "jobs.<job_id>.environment": _row(*_JOB),
    "jobs.<job_id>.environment.url": _row(*_JOB, "job", "runner", "env", "steps"),
    "jobs.<job_id>.if": _row(*_WORKFLOW, "needs", *_STATUS),
    "jobs.<job_id>.name": _row(*_JOB),
    "jobs.<job_id>.outputs.<output_id>": _row(*_STEP),
    "jobs.<job_id>.runs-on": _row(*_JOB),
    "jobs.<job_id>.secrets.<secrets_id>": _row(*_JOB, "secrets"),
    "jobs.<job_id>.services": _row(*_JOB),
    "jobs.<job_id>.services.<service_id>.credentials": _row(*_JOB, "env", "secrets"),
    "jobs.<job_id>.services.<service_id>.env.<env_id>": _row(*_JOB, "job", "runner", "env", "secrets"),
    "jobs.<job_id>.steps.continue-on-error": _row(*_STEP, "hashFiles"),
    "jobs.<job_id>.steps.env": _row(*_STEP, "hashFiles"),
    "jobs.<job_id>.steps.if": _row(*_JOB, "job", "runner", "env", "steps", "hashFiles", *_STATUS),
    "jobs.<job_id>.steps.name": _row(*_STEP, "hashFiles"),
    "jobs.<job_id>.steps.run": _row(*_STEP, "hashFiles"),
    "jobs.<job_id>.steps.timeout-minutes": _row(*_STEP, "hashFiles"),
    "jobs.<job_id>.steps.with": _row(*_STEP, "hashFiles"),
    "jobs.<job_id>.steps.working-directory": _row(*_STEP, "hashFiles"),
    "jobs.<job_id>.strategy": _row(*_WORKFLOW, "needs"),
    "jobs.<job_id>.timeout-minutes": _row(*_JOB),
    "jobs.<job_id>.with.<with_id>": _row(*_JOB),
    # action.yml (the action's own keys; `uses:` with `${{ }}` is Gitea's extension)
    "inputs.<input_id>.default": _row("github", "gitea", "strategy", "matrix", "job", "runner", "hashFiles"),
    "outputs.<output_id>.value": _row(*_ACTION),
    "runs.steps.if": _row(*_ACTION, "hashFiles", *_STATUS),
    "runs.steps": _row(*_ACTION, "hashFiles"),
    "runs.pre-if": _row("github", "gitea", "inputs", "strategy", "matrix", "job", "runner", "env", *_STATUS),
    "runs.post-if": _row("github", "gitea", "inputs", "strategy", "matrix", "job", "runner", "env", *_STATUS),
}
