"""A job's services (native sidecars) before its executor starts: started lines, and the
diagnosis of a service that is unhealthy, cannot be created or cannot be pulled — naming the
service, with its last output and the reason."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dynrunner.controller.backends.base import FailureReason, Phase
from dynrunner.controller.backends.kubernetes.diagnosis import PodFacts, classify, essentials, parse_time
from dynrunner.controller.backends.kubernetes.progress import start_lines

CREATED = "2026-12-01T17:30:29Z"


def pending(*statuses: dict[str, Any]) -> dict[str, Any]:
    """A Pod whose executor waits for its sidecars (PodInitializing), as a real kubelet shows it."""
    return {
        "metadata": {"name": "dr-x", "creationTimestamp": CREATED},
        "spec": {
            "nodeName": "node-1",
            "initContainers": [
                {"name": "redis", "image": "redis:7", "restartPolicy": "Always"},
                {"name": "setup", "image": "busybox"},  # a pod template's plain init container
            ],
            "containers": [{"name": "executor", "image": "executor:1"}],
        },
        "status": {
            "phase": "Pending",
            "startTime": CREATED,
            "initContainerStatuses": list(statuses),
            "containerStatuses": [{"name": "executor", "state": {"waiting": {"reason": "PodInitializing"}}}],
        },
    }


def facts(pod: dict[str, Any], after: float = 5.0, events: tuple[dict[str, Any], ...] = ()) -> PodFacts:
    created = parse_time(CREATED)
    assert created is not None
    return PodFacts(essentials(pod), created + timedelta(seconds=after), events=events)


def test_a_service_still_probing_keeps_the_job_starting() -> None:
    pod = pending({"name": "redis", "started": False, "restartCount": 0, "state": {"running": {}}})
    assert classify(facts(pod)).phase is Phase.STARTING
    assert "service redis started" not in start_lines(essentials(pod), ())


def test_a_started_service_is_a_start_line() -> None:
    pod = pending({"name": "redis", "started": True, "restartCount": 0, "state": {"running": {}}})
    assert "service redis started" in start_lines(essentials(pod), ())


def test_a_failed_startup_probe_fails_the_job_naming_the_service_with_its_output() -> None:
    redis = {
        "name": "redis",
        "started": False,
        "restartCount": 1,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "Error", "message": "Ready to accept connections\n"}},
    }
    events = (
        {"reason": "Unhealthy", "message": "Startup probe failed: other", "fieldPath": "spec.initContainers{other}"},
        {"reason": "Unhealthy", "message": "Startup probe failed: NOAUTH", "fieldPath": "spec.initContainers{redis}"},
    )
    observation = classify(facts(pending(redis), events=events))
    assert observation.phase is Phase.FAILED and observation.diagnosis is not None
    assert observation.diagnosis.reason is FailureReason.START_FAILED
    assert observation.diagnosis.message == (
        "Service 'redis' is unhealthy: its startup probe (`--health-cmd`) kept failing: Startup probe failed: NOAUTH"
    )
    assert observation.diagnosis.detail == "Ready to accept connections"
    assert observation.diagnosis.detail_heading == "last lines of service 'redis' output:"


def test_a_service_that_exits_fails_the_job_with_its_status() -> None:
    redis = {"name": "redis", "restartCount": 0, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
    diagnosis = classify(facts(pending(redis))).diagnosis
    assert diagnosis is not None
    assert diagnosis.message == "Service 'redis' is unhealthy: it exited with status 1 (Error)"
    assert diagnosis.detail == "The service wrote no output."


def test_an_image_that_runs_as_root_under_restricted_says_what_to_do() -> None:
    message = "container has runAsNonRoot and image will run as root (pod: dr-x, container: redis)"
    redis = {"name": "redis", "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}}}
    diagnosis = classify(facts(pending(redis))).diagnosis
    assert diagnosis is not None
    assert diagnosis.message.startswith(f"Service 'redis' could not be started (CreateContainerConfigError): {message}")
    assert "servicePodSecurity: baseline" in diagnosis.message and "--user" in diagnosis.message


def test_a_service_image_that_cannot_be_pulled_fails_after_the_pull_timeout() -> None:
    redis = {"name": "redis", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "denied"}}}
    assert classify(facts(pending(redis), after=60)).phase is Phase.STARTING
    diagnosis = classify(facts(pending(redis), after=301)).diagnosis
    assert diagnosis is not None
    assert diagnosis.message == (
        "the image redis:7 of service 'redis' could not be pulled (ImagePullBackOff; gave up after 300s): denied"
    )


def test_a_plain_init_container_is_not_a_service() -> None:
    setup = {"name": "setup", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    assert "setup" not in str(essentials(pending(setup)))
    assert classify(facts(pending(setup))).phase is Phase.STARTING


def test_a_service_stopped_gracefully_after_its_probe_failed_says_its_output_is_unknown() -> None:
    """redis exits 0 on SIGTERM: the kubelet then keeps no log tail in its termination message."""
    redis = {
        "name": "redis",
        "restartCount": 1,
        "state": {"running": {}},
        "lastState": {"terminated": {"exitCode": 0, "reason": "Completed"}},
    }
    diagnosis = classify(facts(pending(redis))).diagnosis
    assert diagnosis is not None
    assert diagnosis.message == "Service 'redis' is unhealthy: it exited with status 0 (Completed)"
    assert diagnosis.detail.startswith("The service's output is not known: it exited with status 0 when stopped")
