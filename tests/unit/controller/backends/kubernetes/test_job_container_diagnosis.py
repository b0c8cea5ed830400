"""A Pod with a job container (`container:`): the executor's container decides how the job
ended, whatever the job container does; a job container that cannot start, or whose agent
died, fails the job naming it and its image; the agent's init container failing, or its
image (the executor's) not pulled, is diagnosed although the executor waits `PodInitializing`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dynrunner.controller.backends.base import FailureReason, Phase
from dynrunner.controller.backends.kubernetes.backend import KubernetesBackend
from dynrunner.controller.backends.kubernetes.diagnosis import (
    PodFacts,
    classify,
    essentials,
    job_container_waits,
    parse_time,
    waiting_line,
)
from tests.fixtures.kubernetes_backend import settings

CREATED = "2026-12-01T17:30:29Z"
EXECUTOR_IMAGE = "registry.example/dynrunner/executor:1.0"
RUNNING = {"running": {"startedAt": "2026-12-01T17:30:31Z"}}


def pod(
    executor: dict[str, Any],
    job: dict[str, Any] | None,
    *,
    install: dict[str, Any] | None = None,
    phase: str = "Running",
    job_limits: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A job's Pod as the API serves it: `executor`/`job` are container states (None: no status yet)."""
    job_spec: dict[str, Any] = {"name": "job", "image": "node:20", "command": ["/__dynrunner/dynrunner-agent"]}
    if job_limits:
        job_spec["resources"] = {"limits": job_limits}
    statuses = [{"name": "executor", "state": executor}]
    if job is not None:
        statuses.append({"name": "job", "state": job})
    return {
        "metadata": {"name": "dr-x", "creationTimestamp": CREATED, "managedFields": [{"manager": "kubelet"}]},
        "spec": {
            "nodeName": "node-1",
            "initContainers": [{"name": "dynrunner-agent-install", "image": EXECUTOR_IMAGE}],
            "containers": [{"name": "executor", "image": EXECUTOR_IMAGE}, job_spec],
        },
        "status": {
            "phase": phase,
            "startTime": CREATED,
            "initContainerStatuses": [
                {"name": "dynrunner-agent-install", "state": install or {"terminated": {"exitCode": 0}}}
            ],
            "containerStatuses": statuses,
        },
    }


def observe(p: dict[str, Any], after: float = 5.0) -> Any:
    """Classified as the backend does: from what it keeps of the Pod, `after` s past its creation."""
    created = parse_time(CREATED)
    assert created is not None
    whole = classify(PodFacts(p, created + timedelta(seconds=after)))
    kept = classify(PodFacts(essentials(p), created + timedelta(seconds=after)))
    assert kept == whole
    return kept


def test_the_executor_runs_while_the_job_image_is_pulled() -> None:
    p = pod(RUNNING, {"waiting": {"reason": "ContainerCreating"}})
    assert observe(p).phase is Phase.RUNNING
    assert job_container_waits(p) and job_container_waits(essentials(p))
    assert not job_container_waits(pod(RUNNING, {"running": {}}))


def test_a_job_image_that_cannot_be_pulled_fails_the_job_after_the_pull_timeout() -> None:
    p = pod(RUNNING, {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "node:20"'}})
    assert observe(p, after=60).phase is Phase.RUNNING
    observation = observe(p, after=301)
    assert observation.phase is Phase.FAILED and observation.diagnosis is not None
    assert observation.diagnosis.reason is FailureReason.START_FAILED
    assert observation.diagnosis.message == (
        "the image node:20 of the job container could not be pulled (ImagePullBackOff; gave up after 300s): "
        'Back-off pulling image "node:20"'
    )


def test_a_job_image_that_starts_as_root_under_restricted_fails_at_once_saying_what_to_do() -> None:
    message = "container has runAsNonRoot and image will run as root (pod: dr-x, container: job)"
    diagnosis = observe(
        pod(RUNNING, {"waiting": {"reason": "CreateContainerConfigError", "message": message}})
    ).diagnosis
    assert diagnosis is not None and diagnosis.reason is FailureReason.START_FAILED
    assert diagnosis.message.startswith(
        f"the job container (image node:20) could not be started (CreateContainerConfigError): {message} (the image "
        "starts as root: give `container:` a numeric `--user`"
    )


def test_an_invalid_job_image_name_fails_at_once() -> None:
    diagnosis = observe(pod(RUNNING, {"waiting": {"reason": "InvalidImageName", "message": "bad"}})).diagnosis
    assert diagnosis is not None and diagnosis.message == "the job container's image name 'node:20' is invalid: bad"


def test_a_job_container_that_could_not_run_the_agent() -> None:
    terminated = {"exitCode": 128, "reason": "StartError", "message": "exec format error"}
    diagnosis = observe(pod(RUNNING, {"terminated": terminated})).diagnosis
    assert diagnosis is not None
    assert diagnosis.message == "the job container (image node:20) could not be started (StartError)"
    assert (diagnosis.detail, diagnosis.detail_heading) == (
        "exec format error",
        "last lines of the job container's output:",
    )


def test_a_job_container_whose_agent_died_fails_the_job() -> None:
    diagnosis = observe(pod(RUNNING, {"terminated": {"exitCode": 2, "reason": "Error"}})).diagnosis
    assert diagnosis is not None and diagnosis.message == (
        "the job container (image node:20) ended with status 2 (Error) before the job did: the runner's agent in "
        "it is gone"
    )
    oom = pod(RUNNING, {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, job_limits={"memory": "1Gi"})
    diagnosis = observe(oom).diagnosis
    assert diagnosis is not None and diagnosis.reason is FailureReason.OUT_OF_MEMORY
    assert (
        diagnosis.message == "the job container (image node:20) ran out of memory (memory limit 1Gi) and was OOMKilled"
    )


def test_the_agents_shutdown_is_no_failure() -> None:
    """The executor asked the agent to shut down and is about to exit itself."""
    assert observe(pod(RUNNING, {"terminated": {"exitCode": 0, "reason": "Completed"}})).phase is Phase.RUNNING


@pytest.mark.parametrize("job", [RUNNING, {"terminated": {"exitCode": 137, "reason": "Error"}}, None])
def test_the_executor_decides_whatever_the_job_container_does(job: dict[str, Any] | None) -> None:
    """An executor that finished leaves a job container running (it did not reach `shutdown`,
    or the Pod is being stopped): the job's end is the executor's."""
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-12-01T17:30:31Z"}}
    assert observe(pod(done, job)).phase is Phase.SUCCEEDED
    oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    observation = observe(pod(oom, job))
    assert observation.phase is Phase.FAILED and observation.diagnosis is not None
    assert observation.diagnosis.message == "the job ran out of memory: the executor was OOMKilled"


def test_an_agent_install_that_failed_fails_the_job_with_its_output() -> None:
    install = {"terminated": {"exitCode": 1, "reason": "Error", "message": "dynrunner-agent was not found on PATH"}}
    p = pod({"waiting": {"reason": "PodInitializing"}}, None, install=install, phase="Failed")
    observation = observe(p)
    assert observation.phase is Phase.FAILED and observation.diagnosis is not None
    assert observation.diagnosis.message == (
        f"the agent for the job container could not be installed: dynrunner-agent-install (the executor image "
        f"{EXECUTOR_IMAGE}) exited with status 1 (Error); the executor image must carry dynrunner-agent "
        "(images/executor.Containerfile)"
    )
    assert observation.diagnosis.detail == "dynrunner-agent was not found on PATH"
    assert observation.diagnosis.detail_heading == "last lines of dynrunner-agent-install output:"


def test_the_executor_image_pulled_for_the_agents_init_container_is_the_executors_pull() -> None:
    waiting = {"waiting": {"reason": "ErrImagePull", "message": "not found"}}
    p = pod({"waiting": {"reason": "PodInitializing"}}, None, install=waiting, phase="Pending")
    assert observe(p, after=10).phase is Phase.STARTING
    assert waiting_line(p) == f"the executor image {EXECUTOR_IMAGE} cannot be pulled yet (ErrImagePull): not found"
    diagnosis = observe(p, after=301).diagnosis
    assert diagnosis is not None and diagnosis.message.startswith(f"the executor image {EXECUTOR_IMAGE} could not be")


def test_a_pod_that_ended_before_its_executor_ran_is_not_left_starting() -> None:
    p = pod({"waiting": {"reason": "PodInitializing"}}, None, phase="Failed")
    p["spec"]["initContainers"].append({"name": "setup", "image": "busybox"})  # a template's, failed
    observation = observe(p)
    assert observation.phase is Phase.FAILED and observation.diagnosis is not None
    assert observation.diagnosis.message == "the job's Pod ended (Failed) before its executor ran"


def test_the_pools_tick_looks_at_a_running_pod_whose_job_container_waits() -> None:
    """The job image is pulled after the executor started: its pull timing out changes
    nothing in the Pod, so the one-second tick (not only starting Pods) notices it."""
    backend = KubernetesBackend(settings(imagePullTimeoutSeconds=60), api=None)  # type: ignore[arg-type]
    woken: list[str | None] = []
    backend._wake = woken.append
    long_ago = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    for name, job in (("dr-a", {"waiting": {"reason": "ImagePullBackOff"}}), ("dr-b", {"running": {}})):
        p = pod(RUNNING, job)
        p["metadata"].update(name=name, labels={"dynrunner.io/assignment-id": name, "dynrunner.io/task-id": "1"})
        p["metadata"]["creationTimestamp"] = p["status"]["startTime"] = long_ago
        backend.pods.cache[name] = essentials(p)
        backend._phases[name] = Phase.RUNNING
    backend._look_at_starts()
    assert woken == ["dr-a"]
    assert backend._phases == {"dr-a": Phase.FAILED, "dr-b": Phase.RUNNING}
