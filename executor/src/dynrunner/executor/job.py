"""The job loop: one Gitea task's job, step by step, with GitHub's rules.

Order of a job: refuse what this runner cannot run (a bad job key, `container:`/`services:`
where there is no podman); lay out the workspace; evaluate the job's `if:` against `needs`
(Gitea hands over a job whose needs failed when it has an `if:`); a job that calls a reusable
workflow then runs the called jobs here, each a `JobRunner` with a `CallFrame` (`reusable`),
and is done; any other job evaluates the workflow and job `env:`, starts its job container
and services (docs/containers.md), runs the steps (`engine.StepEngine`), then the post steps
their actions left; evaluate the job's `outputs:` and queue them with the artifact refs;
return the result for the reporter.

Job status while steps run (what `success()`, `failure()`, `cancelled()` see): `failure`
after a step whose conclusion is failure, `cancelled` once Gitea cancelled the task. The job
timeout (`timeout-minutes`, 360 by default) fails the job like act_runner does; steps whose
`if:` still holds (`always()`, `failure()`) run afterwards within a 5-minute cleanup budget.
The assignment's deadline is hard: the running step is stopped and nothing else runs.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from dynrunner.executor.actions import Actions, NodeRuntime
from dynrunner.executor.actions.reference import GITHUB_URL
from dynrunner.executor.actions.store import SEEDED_CACHE_ENV, ActionStore
from dynrunner.executor.containers.actions import PodmanImages
from dynrunner.executor.containers.pod import PodContainerConfig, PodJobContainer, sidecar_context
from dynrunner.executor.containers.podman import JobContainers, Podman, PodmanConfig
from dynrunner.executor.containers.source import JobContainerSource, start_within
from dynrunner.executor.containers.spec import ContainerSpec, SpecError, read_job_containers
from dynrunner.executor.contexts import (
    Environment,
    JobContexts,
    debug_flags,
    github_context,
    needs_context,
    process_base_env,
    runner_context,
    runner_env,
    strategy_context,
    write_event_file,
)
from dynrunner.executor.engine import StepEngine
from dynrunner.executor.idtokens import grant_of, open_id_tokens, workload_api_env
from dynrunner.executor.masking import Masker
from dynrunner.executor.reporter import OutputLimitError, Reporter
from dynrunner.executor.reusable import Caller, CallFrame, run_call
from dynrunner.executor.runtime import JobRuntime, RepositoryError
from dynrunner.executor.runtime.artifacts.errors import ArtifactError
from dynrunner.executor.runtime.outputs import OutputLimits
from dynrunner.executor.scope import (
    JOB_DEFAULTS_RUN,
    JOB_ENV,
    JOB_IF,
    JOB_NAME,
    JOB_OUTPUTS,
    JOB_TIMEOUT,
    WORKFLOW_ENV,
    Evaluator,
    Scope,
)
from dynrunner.executor.services import close_services, open_services
from dynrunner.executor.stepenv import StepEnvironment
from dynrunner.executor.steps.base import ContainerImages
from dynrunner.executor.steps.process import StopTimings
from dynrunner.executor.steps.processes import LOCAL, Processes
from dynrunner.executor.supervise import Deadlines, JobSignals
from dynrunner.executor.workflow import RunDefaults, Workflow
from dynrunner.proto.assignment import JOB_KEY_RE, Assignment
from dynrunner.proto.containers import SERVICES_PROVIDED_ENV
from dynrunner.proto.expressions import ExpressionError
from dynrunner.proto.expressions.inputs import inputs_context
from dynrunner.proto.gitea import Need, Result

DEFAULT_TIMEOUT_MINUTES = 360.0


@dataclass(frozen=True, slots=True)
class JobSettings:
    version: str = "dev"
    timings: StopTimings = field(default_factory=StopTimings)
    cleanup_s: float = 300.0
    """How long steps may run, in total, after the job timed out."""


@dataclass(frozen=True, slots=True)
class _JobParts:
    """What the job's set-up hands to its steps."""

    where: Environment
    contexts: JobContexts
    evaluator: Evaluator
    scope: Scope
    runtime: JobRuntime
    signals: JobSignals
    debug: tuple[bool, bool]
    """(step debug, runner debug)"""


@dataclass(frozen=True, slots=True)
class JobResult:
    result: Result
    skipped: bool = False


def _limit(limit_s: float, hard_deadline: float | None) -> float:
    """`limit_s`, or less when the assignment's hard deadline comes first."""
    if hard_deadline is None:
        return limit_s
    return min(limit_s, hard_deadline - asyncio.get_running_loop().time())


def _when(deadline: datetime | None) -> float | None:
    """A wall-clock deadline as a time on the event loop's clock."""
    if deadline is None:
        return None
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline - datetime.now(UTC)).total_seconds()


class JobRunner:
    def __init__(
        self,
        assignment: Assignment,
        workflow: Workflow,
        reporter: Reporter,
        masker: Masker,
        settings: JobSettings = JobSettings(),
        *,
        shutdown: asyncio.Event | None = None,
        frame: CallFrame | None = None,
    ) -> None:
        self.shutdown = shutdown or asyncio.Event()
        self.assignment = assignment
        self.workflow = workflow
        self.reporter = reporter
        self.masker = masker
        self.settings = settings
        self.frame = frame
        """Set for a job of a called workflow (`reusable`): its needs, inputs, secrets and
        workspace are the call's, its rows go to no step, its outputs to the caller."""

    def log(self, text: str) -> None:
        self.reporter.log(text)

    def warning(self, text: str) -> None:
        self.reporter.log(f"##[warning]{text}")

    def error(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            self.reporter.log(f"##[error]{line}")

    # -- the job -------------------------------------------------------------------------

    async def run(self) -> JobResult:
        job = self.workflow.job
        a = self.assignment
        problem = self._refusal()
        if problem:
            self.error(problem)
            return JobResult(Result.FAILURE)
        frame = self.frame
        root = frame.root if frame else Path(a.executor.workspace or Path.cwd())
        needs = frame.needs if frame else a.task.needs
        try:
            runtime = JobRuntime.create(
                root,
                repository=str((a.task.context or {}).get("repository", "")),
                run_id=str((a.task.context or {}).get("run_id", "")),
                job_key=job.key,
                artifacts=a.executor.artifacts,
                needs=needs,
                limits=OutputLimits(total_bytes=a.executor.outputs_total_limit_bytes or OutputLimits().total_bytes),
            )
        except (RepositoryError, ArtifactError, ValueError, OSError) as err:
            self.error(f"The job's workspace could not be prepared: {err}")
            return JobResult(Result.FAILURE)
        ws = runtime.workspace
        where = Environment(
            gitea_url=a.gitea_url,
            runner_name=a.runner.name or f"dynrunner-{a.pool or a.backend}",
            workspace=ws.path,
            temp_dir=ws.temp_dir,
            tool_cache=ws.tool_cache,
            event_path=ws.runtime_dir / "event.json",
            version=self.settings.version,
        )
        secrets = dict(frame.secrets if frame else a.task.secrets)
        variables = dict(a.task.vars)
        step_debug, runner_debug = debug_flags(secrets, variables)
        github = github_context(a.task.context, where, job.key)
        if frame:
            github["job"] = job.key
        write_event_file(github, where.event_path)
        strategy = job.strategy
        contexts = JobContexts(
            github=github,
            needs=needs_context(needs),
            vars=variables,
            secrets=secrets,
            matrix=dict(strategy.matrix) if strategy else {},
            strategy=strategy_context(strategy),
            inputs=dict(frame.inputs) if frame else inputs_context(self.workflow.on, github),
            runner=runner_context(where, runner_debug),
            status=_needs_status(needs),
        )
        scope = Scope.of_job(contexts, ws.path)
        scope.reports = frame is None
        evaluator = Evaluator(scope)
        self._header(where, contexts, evaluator)

        if job.if_:
            try:
                run_job = evaluator.condition(JOB_IF, job.if_)
            except ExpressionError as err:
                self.error(f"The job's `if:` could not be evaluated: {err}")
                return JobResult(Result.FAILURE)
            if not run_job:
                self.log(f"Skipping job '{job.name or job.key}': `if: {job.if_}` is false")
                return JobResult(Result.SKIPPED, skipped=True)
        contexts.status = "success"
        if job.uses:
            return await self._call(contexts, runtime)

        try:
            contexts.env = evaluator.strings(WORKFLOW_ENV, self.workflow.env, env={})
            contexts.env.update(evaluator.strings(JOB_ENV, job.env, env=contexts.env))
            timeout = evaluator.minutes(JOB_TIMEOUT, job.timeout_minutes) or DEFAULT_TIMEOUT_MINUTES
            # GitHub's runner evaluates the job's `defaults.run` once, as the job starts: a later
            # $GITHUB_ENV or a step's `env:` does not change them.
            scope.defaults = RunDefaults(
                shell=evaluator.text(JOB_DEFAULTS_RUN, job.defaults.shell) or self.workflow.defaults.shell,
                working_directory=evaluator.text(JOB_DEFAULTS_RUN, job.defaults.working_directory)
                or self.workflow.defaults.working_directory,
            )
        except ExpressionError as err:
            self.error(str(err))
            return JobResult(Result.FAILURE)

        node = NodeRuntime()
        podman = PodmanConfig.from_env(os.environ)
        pod = PodContainerConfig.from_env(os.environ) if self.frame is None else None
        source: JobContainerSource | None = None
        base_env = process_base_env()
        processes: Processes = LOCAL
        job_spec: ContainerSpec | None = None
        service_specs: list[ContainerSpec] = []
        provided = bool(job.services) and _provided_services() == set(job.services)
        if job.container or job.services:
            try:
                job_spec, service_specs = read_job_containers(job.container, job.services, evaluator.text)
            except (SpecError, ExpressionError) as err:
                self.error(str(err))
                return JobResult(Result.FAILURE)
            for spec in (job_spec, *service_specs):
                if spec is not None and spec.credentials:
                    self.masker.add(spec.credentials[1])
        if pod is not None and job_spec is not None:
            source = PodJobContainer(pod, log=self.log)
            podman = None  # the Pod is the job's boundary: no podman inside it
        elif provided and job_spec is None:
            contexts.services = sidecar_context(service_specs)
            self.log(f"Services: {', '.join(s.name for s in service_specs)} (sidecars of the job's Pod, healthy)")
        elif podman is not None and (job_spec is not None or service_specs):
            source = JobContainers(
                Podman(podman),
                job_id=str(a.task.id),
                root=ws.root,
                runtime_dir=ws.runtime_dir,
                log=self.log,
                node=node.executable() if job_spec else "",
            )
        if source is not None:
            not_started = await start_within(
                source,
                job_spec,
                service_specs,
                limit_s=_limit(timeout * 60, _when(a.deadline)),
                cancelled=self.reporter.cancelled,
                shutdown=self.shutdown,
            )
            if not_started is not None:
                (self.error if not_started.error else self.log)(not_started.message)
                await source.close()
                return JobResult(not_started.result)
            contexts.container = source.job_context()
            contexts.services = source.services_context()
            if job_spec is not None and source.processes is not None:
                base_env = {**source.image_env, **job_spec.env}
                processes = source.processes
                node = NodeRuntime(mounted_at=source.node_mount)
        containers = source if isinstance(source, JobContainers) else None
        images = None
        if podman is not None:
            label = containers.prefix if containers else f"dynrunner-{a.task.id}"
            images = PodmanImages(
                Podman(podman),
                root=ws.root,
                workspace=ws.path,
                label=label,
                network=lambda: containers.network if containers else "",
            )
        loop = asyncio.get_running_loop()
        signals = JobSignals(
            reporter=self.reporter,
            contexts=contexts,
            deadlines=Deadlines(job=loop.time() + timeout * 60, job_minutes=timeout, hard=_when(a.deadline)),
            timings=self.settings.timings,
            cleanup_s=self.settings.cleanup_s,
            shutdown=self.shutdown,
        )
        try:
            return await self._steps(
                _JobParts(where, contexts, evaluator, scope, runtime, signals, (step_debug, runner_debug)),
                base_env,
                processes,
                images,
                node,
                identity=source is None or source.identity_reachable or job_spec is None,
                workload_api=source is None or source.workload_api_reachable or job_spec is None,
            )
        finally:
            if images is not None:
                await images.aclose()
            if source is not None:
                await source.close()

    async def _steps(
        self,
        parts: _JobParts,
        base_env: dict[str, str],
        processes: Processes,
        images: ContainerImages | None,
        node: NodeRuntime,
        *,
        identity: bool,
        workload_api: bool,
    ) -> JobResult:
        """The steps, the post stages and the job's outputs, once its environment is ready;
        `identity`: whether the steps can reach the ID-token endpoint (not in a podman job
        container), `workload_api`: whether the Workload API issues them the job's SVID (not in
        any job container)."""
        a = self.assignment
        job = self.workflow.job
        where, contexts, evaluator, scope, runtime, signals = (
            parts.where,
            parts.contexts,
            parts.evaluator,
            parts.scope,
            parts.runtime,
            parts.signals,
        )
        step_debug, runner_debug = parts.debug
        ws = runtime.workspace
        github = contexts.github
        id_request_token = str((a.task.context or {}).get("actions_id_token_request_token", ""))
        grant = grant_of(self.workflow.permissions, self.workflow.job.permissions)
        id_tokens = await open_id_tokens(a, grant, self.masker.add, self.log) if identity else None
        if not identity and (grant.granted or a.executor.identity.enabled):
            self.log(
                "The job's identity (SPIFFE_ENDPOINT_SOCKET, OIDC ID tokens) is not available to steps in a podman "
                "job container (docs/containers.md)."
            )
        services = await open_services(a.executor.cache, _runtime_token(a), self.warning)
        environment = StepEnvironment(
            base_env,
            runner_env(github, where, _runtime_token(a), runner_debug, id_request_token)
            | services.env()
            | (workload_api_env(a.executor.identity) if workload_api else {})
            | (id_tokens.env() if id_tokens else {}),
            ws.bin_dir,
        )
        engine = StepEngine(
            reporter=self.reporter,
            masker=self.masker,
            runtime=runtime,
            environment=environment,
            signals=signals,
            step_debug=step_debug,
            actions=self._actions(runtime, node),
            processes=processes,
            images=images,
        )
        engine.start()
        try:
            if await engine.actions.prepare(job.steps, scope):
                await engine.run_steps(job.steps, scope)
            else:
                contexts.status = "failure"
            await engine.actions.run_posts()
        finally:
            await engine.aclose()
            await close_services(services)
            if id_tokens is not None:
                await id_tokens.aclose()
        if signals.aborted:
            return JobResult(Result.CANCELLED if self.reporter.server_result == Result.CANCELLED else Result.FAILURE)
        outputs_ok = self._outputs(evaluator, contexts, runtime)
        if contexts.status == "cancelled":
            return JobResult(Result.CANCELLED)
        if contexts.status == "failure" or not outputs_ok:
            return JobResult(Result.FAILURE)
        return JobResult(Result.SUCCESS)

    async def _call(self, contexts: JobContexts, runtime: JobRuntime) -> JobResult:
        """Run the reusable workflow this job calls, inside this task (`reusable.call`)."""
        caller = Caller(
            job=self.workflow.job,
            contexts=contexts.values(),
            chain=self.frame.chain if self.frame else (),
            root=runtime.workspace.runtime_dir,
            store=self.frame.store if self.frame and self.frame.store else self._actions(runtime, NodeRuntime()).store,
            gitea_url=self.assignment.gitea_url,
            log=self.log,
            mask=self.masker.add,
            stopped=lambda: self.reporter.cancelled.is_set() or self.shutdown.is_set(),
            run_job=self._run_called,
        )
        called = await run_call(caller)
        if called.result is Result.SUCCESS and called.outputs and not self._send_outputs(called.outputs):
            return JobResult(Result.FAILURE)
        return JobResult(called.result)

    async def _run_called(self, workflow: Workflow, frame: CallFrame) -> Result:
        runner = JobRunner(
            self.assignment, workflow, self.reporter, self.masker, self.settings, shutdown=self.shutdown, frame=frame
        )
        return (await runner.run()).result

    def _actions(self, runtime: JobRuntime, node: NodeRuntime) -> Actions:
        """Where this job's actions come from: Gitea's default actions instance, fetched with the
        task token only from Gitea itself (its URL here and its own ROOT_URL), an image's seeded
        cache, and Node for JavaScript actions."""
        a = self.assignment
        context = a.task.context or {}
        gitea_urls = tuple(url for url in (a.gitea_url, str(context.get("server_url") or "")) if url)
        seeded = os.environ.get(SEEDED_CACHE_ENV, "")
        store = ActionStore(
            runtime.workspace.runtime_dir / "actions",
            token=str(context.get("token") or ""),
            gitea_urls=gitea_urls,
            seeded=Path(seeded) if seeded else None,
        )
        return Actions(
            store=store,
            workspace=runtime.workspace.path,
            default_actions_url=str(context.get("gitea_default_actions_url") or GITHUB_URL),
            gitea_urls=gitea_urls,
            node=node,
        )

    def _refusal(self) -> str | None:
        job = self.workflow.job
        key = self.assignment.job_key or job.key
        if not JOB_KEY_RE.fullmatch(job.key):
            return (
                f"The job id {job.key!r} cannot be used with this runner: a job id must match "
                "[A-Za-z_][A-Za-z0-9_-]* (it names the job's workload identity). Rename the job."
            )
        if key != job.key and self.frame is None:
            return f"The assignment is for job {key!r}, but the workflow Gitea sent holds job {job.key!r}."
        if not (job.container or job.services):
            return None
        provided = not job.services or _provided_services() == set(job.services)
        pod_container = job.container and self.frame is None and PodContainerConfig.from_env(os.environ) is not None
        if provided and (not job.container or pod_container):
            return None  # the job's Pod runs them (docs/containers.md, "Pods: job containers")
        what = "sets `container:`" if job.container else f"declares `services:` ({', '.join(sorted(job.services))})"
        if self.assignment.backend == "kubernetes":
            if job.container and self.frame is not None:
                return (
                    f"The job {what} in a called workflow, which this runner does not run in Pod pools: the job's "
                    "Pod has one job container, the calling job's. Run the called job in a local or VM pool."
                )
            return (
                f"The job {what}, which its Pod was not built to run (by a controller older than this executor): "
                "run the job in a local or VM pool, or update the controller (docs/containers.md)."
            )
        if PodmanConfig.from_env(os.environ) is None:
            return (
                f"The job {what}, which needs podman in the job's environment, and this environment has none: "
                "install podman (docs/containers.md), choose an image for the pool instead, or remove it."
            )
        return None

    def _header(self, where: Environment, contexts: JobContexts, evaluator: Evaluator) -> None:
        a = self.assignment
        job = self.workflow.job
        try:
            name = evaluator.text(JOB_NAME, job.name) if job.name else job.key
        except ExpressionError:
            name = job.name or job.key
        if self.frame is None:
            self.log(f"dynrunner executor {self.settings.version}")
            self.log(f"Runner: {where.runner_name} (pool {a.pool or '-'}, backend {a.backend or '-'})")
            self.log(f"Task {a.task.id}, job {job.key}: {name}")
        else:
            self.log(f"Job {job.key}: {name}, called by {self.frame.workflow}")
        self.log(f"Workspace: {where.workspace}")
        if contexts.matrix:
            self.log(f"Matrix: {json.dumps(contexts.matrix, sort_keys=True)}")

    def _outputs(self, evaluator: Evaluator, contexts: JobContexts, runtime: JobRuntime) -> bool:
        """Evaluate `outputs:` (values showing a secret are left out, as on GitHub) and queue them."""
        ok = True
        outputs: dict[str, str] = {}
        for key, value in self.workflow.job.outputs.items():
            try:
                text = evaluator.text(JOB_OUTPUTS, value)
            except ExpressionError as err:
                self.error(f"Job output '{key}' could not be evaluated: {err}")
                ok = False
                continue
            if text and self.masker.contains_secret(text):
                self.log(f"##[warning]Skip output '{key}' since it may contain secret.")
                continue
            outputs[key] = text
        outputs.update(runtime.job_outputs())
        if not outputs:
            return ok
        return self._send_outputs(outputs) and ok

    def _send_outputs(self, outputs: dict[str, str]) -> bool:
        """To Gitea (the task's job), or to the calling job (a called workflow's job)."""
        if self.frame is not None:
            self.frame.outputs.update(outputs)
            return True
        try:
            self.reporter.set_outputs(outputs)
        except OutputLimitError as err:
            self.error(f"Job outputs not sent: {err}")
            return False
        return True


def _needs_status(needs: Mapping[str, Need]) -> str:
    """The job status a job-level `if:` sees: failure if a need failed, cancelled if one was
    cancelled, else success (a skipped need counts as success, as on GitHub)."""
    results = [need.result for need in needs.values()]
    if Result.FAILURE in results:
        return "failure"
    if Result.CANCELLED in results:
        return "cancelled"
    return "success"


def _runtime_token(a: Assignment) -> str:
    context = a.task.context or {}
    return str(context.get("gitea_runtime_token") or context.get("token") or "")


def _provided_services() -> set[str]:
    """The services the job's Pod already runs as sidecars (set by the Kubernetes backend)."""
    return {name for name in os.environ.get(SERVICES_PROVIDED_ENV, "").split(",") if name}
