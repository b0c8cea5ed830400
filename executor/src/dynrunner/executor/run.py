"""`dynrunner-executor run --assignment FILE`: run one assigned Gitea task and report it.

Exit status (the launcher and the controller's reaper read it):

  0  the task is finalized in Gitea, whatever the job's result (success, failure,
     cancelled, skipped); nothing is left to do. Also when Gitea ended the task under the
     running job (1.24-1.26 delete the runner on a cancel): the job's cleanup steps ran,
     their output went to stderr, and the task needs nobody to end it
  1  the task could NOT be finalized (Gitea unreachable, credentials refused, ...):
     the controller must finalize it
  2  command-line usage error (nothing was read or reported)
  3  the assignment file is unreadable or unusable even for reporting (no task id, runner
     or Gitea URL; still sealed): nothing was reported, the controller must finalize it

An assignment of an unknown major version, or one that does not decode, is still
reported when its version-independent envelope (task id, runner, Gitea URL) can be read:
a clear line in the job log, then the final UpdateTask with FAILURE.

SIGTERM or SIGINT stops the running step (its process group), reports the job failed and
exits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from dynrunner.executor.containers.pod import job_container_socket, shutdown_agent
from dynrunner.executor.job import JobResult, JobRunner, JobSettings
from dynrunner.executor.masking import Masker
from dynrunner.executor.reporter import Reporter, ReporterConfig
from dynrunner.executor.reporter.accepted import STATE_FILE_ENV, TERMINATION_MESSAGE_ENV, add_to_termination_message
from dynrunner.executor.workflow import WorkflowError, parse_workflow
from dynrunner.proto.assignment import Assignment, AssignmentError, decode, decode_envelope
from dynrunner.proto.gitea import GiteaClient, GiteaError, Result, RunnerCredentials
from dynrunner.proto.gitea.client import exit_without_finalization

EXIT_FINALIZED = 0
EXIT_NOT_FINALIZED = 1
EXIT_UNREADABLE = 3
DEFAULT_IDENTITY_TIMEOUT_S = 60

log = logging.getLogger("dynrunner.executor")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dynrunner-executor")
    except PackageNotFoundError:
        return "dev"


def _reporter_config() -> ReporterConfig:
    """A 1 MiB log backlog before a chatty step is slowed down: the same throughput as 4 MiB
    in the executor benchmark, and the executor stays under 60 MB resident. The accepted
    state goes where the backend asked (`DYNRUNNER_STATE_FILE`, and a Pod's termination
    message)."""
    return ReporterConfig(
        max_backlog_bytes=1 << 20,
        state_file=os.environ.get(STATE_FILE_ENV) or None,
        termination_message=os.environ.get(TERMINATION_MESSAGE_ENV) or None,
    )


@dataclass(frozen=True, slots=True)
class RunOptions:
    job: JobSettings = field(default_factory=lambda: JobSettings(version=_version()))
    reporter: ReporterConfig = field(default_factory=_reporter_config)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--assignment", required=True, type=Path, metavar="FILE", help="the assignment (protobuf)")
    parser.epilog = (
        "exit status: 0 finalized in Gitea (any job result); 1 not finalized; 2 usage error; "
        "3 assignment unreadable, nothing reported"
    )


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        data = Path(args.assignment).read_bytes()
    except OSError as err:
        print(f"dynrunner-executor: cannot read the assignment {args.assignment}: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    code = asyncio.run(run_assignment(data))
    if threading.current_thread() is threading.main_thread():
        exit_without_finalization(code)
    return code


READY_FILE_ENV = "DYNRUNNER_READY_FILE"


def _signal_ready() -> None:
    """Tell the backend the executor has taken over the task (it reached Gitea): the controller's
    launched → executor-ready latency. Best effort; the job does not depend on it."""
    path = os.environ.get(READY_FILE_ENV)
    if path:
        try:
            with open(path, "x"):
                pass
        except OSError as err:
            log.debug("cannot write the ready file %s: %s", path, err)


CREDENTIAL_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
"""Credentials the executor itself may hold (the S3 artifact store's); steps inherit them, so
they are masked like the task's secrets."""


def _masker(a: Assignment) -> Masker:
    masker = Masker()
    context = a.task.context or {}
    tokens = ("token", "gitea_runtime_token", "actions_id_token_request_token")
    own = (os.environ.get(name) for name in CREDENTIAL_ENV)
    for value in (*a.task.secrets.values(), a.runner.token, *(context.get(key) for key in tokens), *own):
        if isinstance(value, str) and value:
            masker.add(value)
    return masker


async def run_assignment(data: bytes, options: RunOptions | None = None) -> int:
    """Run (or refuse) one encoded assignment; returns the exit status. In a Pod with a job
    container, its agent is then asked to shut down, whatever happened (the job loop asks
    first when it ran the job; this covers a job refused, skipped or failed before), so the
    Pod ends with the executor (docs/containers.md)."""
    try:
        return await _run_assignment(data, options or RunOptions())
    finally:
        socket = job_container_socket()
        if socket is not None:
            await asyncio.shield(shutdown_agent(socket))


async def _run_assignment(data: bytes, options: RunOptions) -> int:
    try:
        assignment = decode(data)
    except AssignmentError as err:
        return await _refuse(data, str(err), options)
    if assignment.sealed is not None or not assignment.runner.token:
        print("dynrunner-executor: the assignment's secrets are still sealed; nothing can be reported", file=sys.stderr)
        return EXIT_UNREADABLE
    if assignment.executor.log_level:
        logging.getLogger("dynrunner").setLevel(assignment.executor.log_level.upper())
    masker = _masker(assignment)
    client = GiteaClient(assignment.gitea_url, RunnerCredentials(assignment.runner.uuid, assignment.runner.token))
    reporter = Reporter(client, assignment.task.id, masker, options.reporter)
    workflow = None
    problem = ""
    try:
        workflow = parse_workflow(assignment.task.workflow_payload or b"")
    except WorkflowError as err:
        problem = f"The workflow Gitea sent for this job cannot be run: {err}"
    except Exception as err:  # a parser bug: report it rather than die before reporting anything
        log.error("task %d: internal error while parsing\n%s", assignment.task.id, masker.mask(traceback.format_exc()))
        problem = f"The executor failed to read the workflow: {type(err).__name__}: {err}"
    try:
        await reporter.start(len(workflow.job.steps) if workflow else 0)
    except GiteaError as err:
        # Nothing runs that could not be reported; close() tries Gitea once more.
        log.error("task %d: cannot report to Gitea, the job is not run: %s", assignment.task.id, err)
        reporter.log(f"##[error]The job was not run: Gitea could not be reached to report it ({err}).")
        finalized = await reporter.close(Result.FAILURE)
        return EXIT_FINALIZED if finalized else EXIT_NOT_FINALIZED
    _signal_ready()
    shutdown = asyncio.Event()
    summary: dict[str, float] = {}
    with _signals(shutdown):
        result = await _run(assignment, workflow, problem, reporter, masker, options, shutdown, summary)
    finalized = await reporter.close(result.result, skipped=result.skipped)
    if reporter.unreported:
        how = "ended by Gitea under the job (not reported)"
    else:
        how = "finalized" if finalized else "NOT finalized"
    log.info("task %d: %s, %s", assignment.task.id, result.result.name, how)
    if finalized:
        _write_summary(summary)
    return EXIT_FINALIZED if finalized else EXIT_NOT_FINALIZED


SPIFFE_ENDPOINT_ENV = "SPIFFE_ENDPOINT_SOCKET"


def _write_summary(summary: dict[str, float]) -> None:
    """Tell the backend what only the executor measures (how long the identity took), as the
    container's termination message, beside the accepted state already there: Kubernetes
    copies that file into the Pod's status, which the controller watches anyway. Written only
    once the task is finalized. Best effort."""
    path = os.environ.get(TERMINATION_MESSAGE_ENV)
    if not path or not summary:
        return
    try:
        add_to_termination_message(path, summary)
    except OSError as err:
        log.debug("cannot write the termination message %s: %s", path, err)


async def _run(
    assignment: Assignment,
    workflow: object,
    problem: str,
    reporter: Reporter,
    masker: Masker,
    options: RunOptions,
    shutdown: asyncio.Event,
    summary: dict[str, float],
) -> JobResult:
    from dynrunner.executor.workflow import Workflow

    if problem or not isinstance(workflow, Workflow):
        reporter.log(f"##[error]{problem}")
        return JobResult(Result.FAILURE)
    try:
        identity = assignment.executor.identity
        if identity.enabled:
            from dynrunner.executor.identity import IdentityError, wait_for_svid

            timeout = float(identity.timeout_seconds or DEFAULT_IDENTITY_TIMEOUT_S)
            if assignment.deadline is not None:
                timeout = max(0.0, min(timeout, (assignment.deadline - datetime.now(UTC)).total_seconds()))
            # The assignment may name the socket; a backend that knows where it is inside the
            # environment sets SPIFFE_ENDPOINT_SOCKET instead, as for any SPIFFE-aware tool.
            socket = identity.workload_api_socket or os.environ.get(SPIFFE_ENDPOINT_ENV, "")
            try:
                summary["identityWaitSeconds"] = round(
                    await wait_for_svid(assignment.spiffe_id, socket, timeout, reporter.log), 3
                )
            except IdentityError as err:
                reporter.log(f"##[error]{err}")
                return JobResult(Result.FAILURE)
        runner = JobRunner(assignment, workflow, reporter, masker, options.job, shutdown=shutdown)
        return await runner.run()
    except Exception as err:  # an engine bug: report it in the job log rather than lose the task
        log.error("task %d: internal error\n%s", assignment.task.id, masker.mask(traceback.format_exc()))
        reporter.log(f"##[error]The executor failed unexpectedly: {type(err).__name__}: {err}")
        return JobResult(Result.FAILURE)


async def _refuse(data: bytes, reason: str, options: RunOptions) -> int:
    """Report an assignment this executor will not run, if it can be reported at all."""
    try:
        envelope = decode_envelope(data)
    except AssignmentError as err:
        print(f"dynrunner-executor: {reason}; it cannot be reported either: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    if not envelope.runner.token:
        print(f"dynrunner-executor: {reason}; its runner token is sealed, so it cannot be reported", file=sys.stderr)
        return EXIT_UNREADABLE
    client = GiteaClient(envelope.gitea_url, RunnerCredentials(envelope.runner.uuid, envelope.runner.token))
    reporter = Reporter(client, envelope.task_id, Masker([envelope.runner.token]), options.reporter)
    try:
        await reporter.start(0)
    except GiteaError as err:
        log.error("task %d: cannot reach Gitea to report: %s", envelope.task_id, err)
    reporter.log(f"##[error]This executor cannot run the assignment: {reason}")
    finalized = await reporter.close(Result.FAILURE)
    return EXIT_FINALIZED if finalized else EXIT_NOT_FINALIZED


class _signals:
    """SIGTERM/SIGINT set `shutdown` while the job runs (main thread only)."""

    def __init__(self, shutdown: asyncio.Event) -> None:
        self.shutdown = shutdown
        self.installed: list[signal.Signals] = []

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.shutdown.set)
            self.installed.append(sig)

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.installed:
            loop.remove_signal_handler(sig)
