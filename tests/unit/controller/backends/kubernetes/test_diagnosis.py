"""The Pod classifier on recorded Pod JSON (pods/*.json: what the kubelet reports in each
state, as the API serves it — recorded from the kubelet double, whose shapes follow the
kubelet's), plus states only a real cluster reaches (an invalid image name, a sidecar)."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.backends.base import FailureReason, Phase
from dynrunner.controller.backends.kubernetes.diagnosis import (
    PodFacts,
    classify,
    essentials,
    executor_ran,
    parse_time,
    waiting_line,
)
from dynrunner.controller.backends.kubernetes.progress import start_lines, started_line
from dynrunner.proto.gitea import Result

PODS = Path(__file__).parent / "pods"


def pod(name: str) -> dict[str, Any]:
    return json.loads((PODS / f"{name}.json").read_text())


def facts(p: dict[str, Any], after: float = 1.0, **options: Any) -> PodFacts:
    """The Pod observed `after` seconds past its creation."""
    created = parse_time(p["metadata"]["creationTimestamp"])
    assert created is not None
    return PodFacts(p, created + timedelta(seconds=after), **options)


def test_succeeded_is_the_executors_exit_0() -> None:
    observation = classify(facts(pod("succeeded")))
    assert (observation.phase, observation.diagnosis, observation.exit_code) == (Phase.SUCCEEDED, None, 0)
    assert observation.ready_at == parse_time("2026-12-01T17:30:28Z") or observation.ready_at is not None


@pytest.mark.parametrize(
    ("message", "wait"),
    [
        ('{"identityWaitSeconds": 2.25}', 2.25),
        ('{"identityWaitSeconds": 0}', 0.0),
        ("", None),
        ("not json", None),
        ('{"identityWaitSeconds": "3"}', None),
        ("[1]", None),
        ('{"identityWaitSeconds": -1}', None),
    ],
)
def test_the_identity_wait_comes_from_the_executors_termination_message(message: str, wait: float | None) -> None:
    done = pod("succeeded")
    done["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = message
    assert classify(facts(done)).identity_wait_s == wait
    assert classify(facts(essentials(done))).identity_wait_s == wait


def test_a_sidecar_keeping_the_pod_running_does_not_hold_the_job() -> None:
    p = pod("succeeded")
    p["status"]["phase"] = "Running"
    p["status"]["containerStatuses"].append({"name": "docker", "state": {"running": {"startedAt": "x"}}})
    assert classify(facts(p)).phase is Phase.SUCCEEDED


def test_running() -> None:
    observation = classify(facts(pod("running")))
    assert observation.phase is Phase.RUNNING and observation.ready_at is not None


def test_an_executor_that_failed_before_reporting() -> None:
    observation = classify(facts(pod("executor-failed")))
    assert observation.phase is Phase.FAILED and observation.exit_code == 3
    assert observation.diagnosis is not None
    assert observation.diagnosis.reason is FailureReason.EXECUTOR_FAILED
    assert observation.diagnosis.message == "the executor exited with status 3 before it reported the job's result"
    assert "exit:3" in observation.diagnosis.detail  # the log's tail, FallbackToLogsOnError


@pytest.mark.parametrize(
    ("name", "reason", "message"),
    [
        (
            "oom-killed",
            FailureReason.OUT_OF_MEMORY,
            "the job ran out of memory (memory limit 1Gi): the executor was OOMKilled",
        ),
        (
            "evicted",
            FailureReason.EVICTED,
            "the job's Pod was evicted by its node: The node was low on resource: memory. "
            "Threshold quantity: 100Mi, available: 50Mi.",
        ),
        (
            "deadline-exceeded",
            FailureReason.DEADLINE_EXCEEDED,
            "the job's Pod ran longer than its deadline (1s: the job's timeout plus a grace period) "
            "and Kubernetes stopped it",
        ),
        (
            "node-lost",
            FailureReason.VANISHED,
            "the node node-a running the job stopped responding (node lost); Kubernetes deleted the job's Pod",
        ),
    ],
)
def test_the_pod_ended(name: str, reason: FailureReason, message: str) -> None:
    observation = classify(facts(pod(name)))
    assert observation.phase is Phase.FAILED
    assert observation.diagnosis is not None
    assert (observation.diagnosis.reason, observation.diagnosis.message) == (reason, message)


ACCEPTED = '{"result":"","steps":"sr-","started":{"1":1796205600}}'
"""What the executor's termination message holds once Gitea took step 1 done and step 2 begun."""


@pytest.mark.parametrize("name", ["executor-failed", "oom-killed", "evicted", "deadline-exceeded"])
def test_an_executor_that_ended_without_finalizing_gives_the_steps_gitea_accepted(name: str) -> None:
    """Issue 18 item 7: the termination message is the state, not the diagnosis' evidence."""
    ended = pod(name)
    ended["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = ACCEPTED
    for seen in (ended, essentials(ended)):
        observation = classify(facts(seen))
        assert observation.phase is Phase.FAILED and observation.diagnosis is not None
        assert observation.reported is not None
        assert [(s.result, s.started_at is not None) for s in observation.reported.steps] == [
            (Result.SUCCESS, False),
            (Result.UNSPECIFIED, True),
            (Result.UNSPECIFIED, False),
        ]
        assert ACCEPTED not in observation.diagnosis.detail


def test_an_executor_that_reported_nothing_leaves_the_steps_unknown() -> None:
    observation = classify(facts(pod("executor-failed")))
    assert observation.reported is None  # the log's tail is no state
    assert classify(facts(pod("deleting"), gone=True)).reported is None


def test_deleted_by_someone_else_while_running_waits_for_the_executor() -> None:
    """The kubelet sends SIGTERM: the executor reports the job stopped and finalizes."""
    deleting = pod("deleting")
    assert classify(facts(deleting)).phase is Phase.RUNNING
    finalized = copy.deepcopy(deleting)
    finalized["status"]["containerStatuses"] = pod("succeeded")["status"]["containerStatuses"]
    assert classify(facts(finalized)).phase is Phase.SUCCEEDED
    killed = copy.deepcopy(deleting)
    killed["status"]["containerStatuses"] = pod("deadline-exceeded")["status"]["containerStatuses"]
    observation = classify(facts(killed))
    assert observation.diagnosis is not None and observation.diagnosis.reason is FailureReason.VANISHED
    assert observation.diagnosis.message.startswith("the job's Pod was deleted by someone other than the controller")


def test_a_pod_gone_before_its_executor_ended() -> None:
    observation = classify(facts(pod("deleting"), gone=True))
    assert observation.phase is Phase.FAILED
    assert observation.diagnosis is not None and observation.diagnosis.reason is FailureReason.VANISHED
    assert observation.diagnosis.message == (
        "the job's Pod was deleted by someone other than the controller before the job finished"
    )
    assert classify(facts(pod("succeeded"), gone=True)).phase is Phase.SUCCEEDED


def test_never_seen_is_gone() -> None:
    assert classify(PodFacts(None, parse_time("2026-01-01T00:00:00Z"))).phase is Phase.GONE  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["err-image-pull", "image-pull-backoff"])
def test_image_pull_errors_are_given_time(name: str) -> None:
    p = pod(name)
    assert classify(facts(p, after=10, image_pull_timeout=timedelta(seconds=300))).phase is Phase.STARTING
    assert waiting_line(p).startswith("the executor image registry.example/")
    observation = classify(facts(p, after=301, image_pull_timeout=timedelta(seconds=300)))
    assert observation.phase is Phase.FAILED and observation.diagnosis is not None
    assert observation.diagnosis.reason is FailureReason.START_FAILED
    assert observation.diagnosis.message.startswith("the executor image registry.example/")
    assert "gave up after 300s" in observation.diagnosis.message
    assert ("not found" if name == "err-image-pull" else "pull access denied") in observation.diagnosis.message


def test_unschedulable_carries_the_schedulers_message() -> None:
    p = pod("unschedulable")
    assert classify(facts(p, after=30)).phase is Phase.STARTING
    assert waiting_line(p) == (
        "waiting for a node: 0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
        "1 No preemption victims found for incoming pod."
    )
    observation = classify(facts(p, after=601))
    assert observation.diagnosis is not None and observation.diagnosis.reason is FailureReason.UNSCHEDULABLE
    assert observation.diagnosis.message.startswith(
        "no node could run the job's Pod within 600s: 0/1 nodes are available: 1 Insufficient cpu."
    )


def test_a_container_that_cannot_be_configured_fails_at_once() -> None:
    observation = classify(facts(pod("create-container-config-error")))
    assert observation.phase is Phase.FAILED and observation.diagnosis is not None
    assert observation.diagnosis.reason is FailureReason.START_FAILED
    assert observation.diagnosis.message == (
        'the executor\'s container could not be created (CreateContainerConfigError): secret "nope" not found'
    )


def test_an_invalid_image_name_fails_at_once() -> None:
    p = pod("err-image-pull")
    p["status"]["containerStatuses"][0]["state"] = {
        "waiting": {
            "reason": "InvalidImageName",
            "message": 'Failed to apply default image tag "Registry/X:1": couldn\'t parse image name '
            '"Registry/X:1": invalid reference format: repository name must be lowercase',
        }
    }
    observation = classify(facts(p))
    assert observation.diagnosis is not None and observation.diagnosis.reason is FailureReason.START_FAILED
    assert "invalid reference format" in observation.diagnosis.message


def test_a_volume_that_cannot_be_mounted_fails_after_the_start_timeout() -> None:
    p = pod("err-image-pull")
    p["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    mount = {
        "reason": "FailedMount",
        "message": 'MountVolume.SetUp failed for volume "spiffe-workload-api" : kubernetes.io/csi: mounter.SetUpAt '
        "failed to get CSI client: driver name csi.spiffe.io not found in the list of registered CSI drivers",
    }
    assert classify(facts(p, after=5, events=(mount,))).phase is Phase.STARTING
    observation = classify(facts(p, after=601, events=(mount,)))
    assert observation.diagnosis is not None and observation.diagnosis.reason is FailureReason.START_FAILED
    assert observation.diagnosis.message.startswith("the job's Pod could not start within 600s (FailedMount): ")
    assert "csi.spiffe.io not found" in observation.diagnosis.message


def test_our_own_deletion_is_not_someone_elses() -> None:
    killed = pod("deleting")
    killed["status"]["containerStatuses"] = pod("deadline-exceeded")["status"]["containerStatuses"]
    observation = classify(facts(killed, deleted_by_us=True))
    assert observation.diagnosis is not None and observation.diagnosis.reason is FailureReason.KILLED
    assert "someone other" not in observation.diagnosis.message


@pytest.mark.parametrize("name", sorted(p.stem for p in PODS.glob("*.json")))
def test_what_is_kept_of_a_pod_classifies_and_reads_as_the_whole_pod(name: str) -> None:
    """The pool's Pods are cached as `essentials`: nothing the classifier, the start lines,
    finding or the identity entry read may be lost."""
    whole = pod(name)
    kept = essentials(whole)
    for options in ({}, {"after": 700.0}, {"gone": True}):
        assert classify(facts(kept, **options)) == classify(facts(whole, **options))
    assert waiting_line(kept) == waiting_line(whole)
    assert start_lines(kept, []) == start_lines(whole, [])
    assert started_line(kept) == started_line(whole)
    assert executor_ran(kept) == executor_ran(whole)
    for key in ("name", "uid", "labels", "creationTimestamp"):
        assert kept["metadata"].get(key) == whole["metadata"].get(key)
    assert kept["spec"].get("nodeName") == whole["spec"].get("nodeName")
    assert len(json.dumps(kept)) < len(json.dumps(whole)) / 2
