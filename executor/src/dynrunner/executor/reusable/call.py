"""Running a job-level `uses:` inside the calling job's task, the way act_runner does.

Gitea 1.24–1.26 do not expand reusable workflows: the calling job is one task whose payload
is the caller job itself (`uses`, `with`, `secrets`, no steps, so no step rows), and the
runner fetches the called workflow and runs all of its jobs inside that task. Here:

1. read the call (`calls.parse_call`) and fetch the workflow from the Gitea instance with the
   task token (the actions fetcher: `./` form = the caller's repository at `github.sha`);
2. refuse a call that would exceed `MAX_LEVELS`, or call a workflow already in the chain;
3. check `on.workflow_call` against the call: inputs typed, secrets mapped (every value added
   to the masker);
4. run the called jobs one after another, needed jobs first, each matrix combination a job
   (`plan`), each in its own fresh workspace under the caller's runtime directory, with
   `needs` of its own jobs, `inputs`, `secrets` and `github`/`vars` of the caller. A job whose
   needs did not all succeed is skipped unless it has an `if:` (Gitea's rule for a run's jobs).
   A called job may itself call a workflow (recursion, one level deeper);
5. evaluate `on.workflow_call.outputs` with the `jobs` context: the caller's outputs.

A called job that failed under a job-level `continue-on-error` lets the jobs that need it run
and the call succeed, as Gitea treats a run's jobs.

Every called job's rows go to the task's log (as act_runner's do: Gitea has no step rows for a
calling job), framed by a line naming the job. The caller's result: failure when a called job
failed (without `continue-on-error`), cancelled when one was cancelled, else success.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynrunner.executor.actions.reference import RemoteAction
from dynrunner.executor.actions.store import ActionStore, FetchError
from dynrunner.executor.contexts import strategy_context
from dynrunner.executor.reusable.calls import (
    MAX_LEVELS,
    CallError,
    CallRef,
    call_spec,
    parse_call,
    resolve_inputs,
    resolve_secrets,
)
from dynrunner.executor.reusable.plan import PlannedJob, instances, plan_jobs
from dynrunner.executor.workflow import Job, Workflow, WorkflowError, load_workflow
from dynrunner.executor.workflow.yaml12 import plain
from dynrunner.proto.expressions import (
    ALLOWED_CONTEXTS,
    EvalEnv,
    ExpressionError,
    interpolate,
    interpolate_tree,
    is_truthy,
)
from dynrunner.proto.gitea import Need, Result

INPUT_DEFAULT = "on.workflow_call.inputs.<inputs_id>.default"
OUTPUT_VALUE = "on.workflow_call.outputs.<output_id>.value"
JOB_STRATEGY = "jobs.<job_id>.strategy"
JOB_CONTINUE = "jobs.<job_id>.continue-on-error"
CALL_WITH = "jobs.<job_id>.with.<with_id>"
CALL_SECRET = "jobs.<job_id>.secrets.<secrets_id>"


@dataclass(frozen=True, slots=True)
class CallFrame:
    """What a called job gets instead of the task's own: its workflow's chain of calls, its
    `needs`, `inputs` and `secrets`, a workspace root, and where its outputs go."""

    chain: tuple[str, ...]
    needs: Mapping[str, Need]
    inputs: Mapping[str, Any]
    secrets: Mapping[str, str]
    root: Path
    workflow: str
    """The called workflow as written in `uses:` (for the log)."""
    store: ActionStore | None = None
    """Where the calling job fetched workflows: a nested call reuses what it holds."""
    outputs: dict[str, str] = field(default_factory=dict)


RunJob = Callable[[Workflow, CallFrame], Awaitable[Result]]


@dataclass(frozen=True, slots=True)
class Caller:
    """The calling job, its contexts evaluated as it starts."""

    job: Job
    contexts: Mapping[str, Any]
    """github, vars, secrets, needs, strategy, matrix, inputs of the caller."""
    chain: tuple[str, ...]
    root: Path
    store: ActionStore
    gitea_url: str
    log: Callable[[str], None]
    mask: Callable[[str], None]
    stopped: Callable[[], bool]
    """Whether the job was cancelled or must stop: no further called job starts."""
    run_job: RunJob


@dataclass(frozen=True, slots=True)
class CallResult:
    result: Result
    outputs: dict[str, str] = field(default_factory=dict)


def _env(contexts: Mapping[str, Any], where: str, status: str = "success") -> EvalEnv:
    return EvalEnv(dict(contexts), ALLOWED_CONTEXTS[where], status)


def _typed(value: Any, contexts: Mapping[str, Any], where: str) -> Any:
    if isinstance(value, str) and "${{" not in value:
        return value
    return interpolate_tree(value, _env(contexts, where), keep_types=True)


async def run_call(caller: Caller) -> CallResult:
    """Run the workflow `caller.job` calls; errors are logged and fail the call."""
    uses = caller.job.uses or ""
    github = caller.contexts.get("github") or {}
    try:
        ref = parse_call(uses, repository=str(github.get("repository") or ""), sha=str(github.get("sha") or ""))
        chain = (*caller.chain, ref.key)
        if ref.key in caller.chain:
            raise CallError(f"`uses: {ref}` calls a workflow that is already being called: {' → '.join(chain)}")
        if len(chain) + 1 > MAX_LEVELS:
            raise CallError(
                f"`uses: {ref}` would connect {len(chain) + 1} levels of workflows; at most {MAX_LEVELS} are "
                f"allowed (the top-level workflow and {MAX_LEVELS - 1} levels of reusable workflows)"
            )
        doc = await _fetch(caller, ref)
        called = _Called(caller, ref, doc, chain)
        inputs, secrets = called.arguments()
    except (CallError, WorkflowError, FetchError, ExpressionError) as err:
        _error(caller.log, str(err))
        return CallResult(Result.FAILURE)
    return await called.run(inputs, secrets)


def _error(log: Callable[[str], None], text: str) -> None:
    for line in text.splitlines() or [""]:
        log(f"##[error]{line}")


async def _fetch(caller: Caller, ref: CallRef) -> Mapping[str, Any]:
    remote = RemoteAction(caller.gitea_url.rstrip("/"), ref.owner, ref.repo, "", ref.ref)
    fetched = await caller.store.get(remote, caller.log)
    path = fetched.directory / ref.path
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise CallError(f"`uses: {ref}`: {ref.repository} has no file {ref.path} at {ref.ref}") from None
    except OSError as err:
        raise CallError(f"`uses: {ref}`: cannot read {ref.path}: {err}") from None
    try:
        return load_workflow(text)
    except WorkflowError as err:
        raise CallError(f"`uses: {ref}`: {err}") from None


class _Called:
    def __init__(self, caller: Caller, ref: CallRef, doc: Mapping[str, Any], chain: tuple[str, ...]) -> None:
        self.caller = caller
        self.ref = ref
        self.doc = doc
        self.chain = chain
        self.name = f"the workflow {ref}"
        self.spec = call_spec(plain(doc.get("on")), self.name)

    def arguments(self) -> tuple[dict[str, Any], dict[str, str]]:
        """(inputs, secrets) of the call; raises CallError or ExpressionError."""
        c = self.caller
        given = {key: _typed(value, c.contexts, CALL_WITH) for key, value in c.job.with_.items()}
        base = {k: c.contexts[k] for k in ("github", "gitea", "vars") if k in c.contexts}

        def default(key: str, value: Any) -> Any:
            return _typed(value, {**base, "inputs": {}}, INPUT_DEFAULT)

        inputs = resolve_inputs(self.spec, given, default, self.name)

        def secret(key: str, value: Any) -> str:
            text = interpolate(str(value), _env(c.contexts, CALL_SECRET)) if value is not None else ""
            return text

        secrets = resolve_secrets(self.spec, c.job.secrets, c.contexts.get("secrets") or {}, secret, self.name)
        for value in secrets.values():
            if value:
                c.mask(value)
        return inputs, secrets

    async def run(self, inputs: dict[str, Any], secrets: dict[str, str]) -> CallResult:
        c = self.caller
        try:
            jobs = plan_jobs(self.doc, self.name)
        except WorkflowError as err:
            _error(c.log, str(err))
            return CallResult(Result.FAILURE)
        results: dict[str, Need] = {}
        tolerated: set[str] = set()  # failed, but under `continue-on-error`: counts as success
        counter = 0
        stopped = False
        for job in jobs:
            needs = {n: results[n] for n in job.needs}
            if stopped or c.stopped():
                stopped = True
                results[job.key] = Need(outputs={}, result=Result.CANCELLED)
                continue
            if not job.has_if and any(
                n.result is not Result.SUCCESS and key not in tolerated for key, n in needs.items()
            ):
                c.log(f"Skipping job '{job.key}' of {self.ref}: a job it needs did not succeed")
                results[job.key] = Need(outputs={}, result=Result.SKIPPED)
                continue
            try:
                workflows = self._instances(job, inputs, needs)
            except (WorkflowError, ExpressionError) as err:
                _error(c.log, str(err))
                results[job.key] = Need(outputs={}, result=Result.FAILURE)
                continue
            outcome: list[Result] = []
            outputs: dict[str, str] = {}
            forgiven = True
            for workflow in workflows:
                if c.stopped():
                    outcome.append(Result.CANCELLED)
                    break
                counter += 1
                frame = CallFrame(
                    chain=self.chain,
                    needs=needs,
                    inputs=inputs,
                    secrets=secrets,
                    root=c.root / "calls" / f"{len(self.chain)}-{counter}-{job.key}",
                    workflow=str(self.ref),
                    store=c.store,
                )
                c.log(f"##[group]Job {job.key} of {self.ref}")
                result = await c.run_job(workflow, frame)
                c.log("##[endgroup]")
                c.log(f"Job {job.key} of {self.ref}: {result.word}")
                outcome.append(result)
                outputs.update(frame.outputs)
                if result is Result.FAILURE:
                    forgiven = forgiven and self._continues(workflow, inputs, needs)
            results[job.key] = Need(outputs=outputs, result=_aggregate(outcome))
            if results[job.key].result is Result.FAILURE and forgiven:
                tolerated.add(job.key)
        overall = _aggregate([Result.SUCCESS if k in tolerated else n.result for k, n in results.items()])
        if overall is Result.SKIPPED:
            overall = Result.SUCCESS
        if overall is not Result.SUCCESS:
            return CallResult(overall)
        try:
            return CallResult(Result.SUCCESS, self._outputs(inputs, results))
        except ExpressionError as err:
            _error(c.log, f"{self.name}: an output could not be evaluated: {err}")
            return CallResult(Result.FAILURE)

    def _continues(self, workflow: Workflow, inputs: Mapping[str, Any], needs: Mapping[str, Need]) -> bool:
        """A failed called job's `continue-on-error`: true lets the jobs that need it run and
        the call succeed (Gitea's rule for a run's jobs); `needs.<id>.result` stays failure."""
        job = workflow.job
        if job.continue_on_error in (None, False, ""):
            return False
        contexts = {
            **self._contexts(inputs),
            "needs": {k: {"outputs": dict(n.outputs), "result": n.result.word} for k, n in needs.items()},
            "matrix": dict(job.strategy.matrix) if job.strategy else {},
            "strategy": strategy_context(job.strategy),
        }
        try:
            value = _typed(job.continue_on_error, contexts, JOB_CONTINUE)
        except ExpressionError as err:
            _error(self.caller.log, f"jobs.{job.key}.continue-on-error could not be evaluated: {err}")
            return False
        if isinstance(value, str):
            return value.strip().lower() == "true"
        return is_truthy(value)

    def _contexts(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        c = self.caller.contexts
        return {
            "github": c.get("github") or {},
            "gitea": c.get("github") or {},
            "vars": c.get("vars") or {},
            "inputs": inputs,
        }

    def _instances(self, job: PlannedJob, inputs: Mapping[str, Any], needs: Mapping[str, Need]) -> list[Workflow]:
        contexts = {
            **self._contexts(inputs),
            "needs": {k: {"outputs": dict(n.outputs), "result": n.result.word} for k, n in needs.items()},
        }
        return instances(self.doc, job, lambda value: _typed(value, contexts, JOB_STRATEGY), self.name)

    def _outputs(self, inputs: Mapping[str, Any], results: Mapping[str, Need]) -> dict[str, str]:
        jobs = {k: {"outputs": dict(n.outputs), "result": n.result.word} for k, n in results.items()}
        env = _env({**self._contexts(inputs), "jobs": jobs}, OUTPUT_VALUE)
        return {key: interpolate(str(value), env) for key, value in self.spec.outputs.items()}


def _aggregate(results: list[Result]) -> Result:
    """One result of several jobs (a matrix, or all of a workflow's): failure wins, then
    cancelled; all skipped is skipped; else success."""
    if Result.FAILURE in results:
        return Result.FAILURE
    if Result.CANCELLED in results:
        return Result.CANCELLED
    if results and all(r is Result.SKIPPED for r in results):
        return Result.SKIPPED
    return Result.SUCCESS
