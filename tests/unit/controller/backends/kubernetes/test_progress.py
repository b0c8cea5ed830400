"""Stage lines of a Pod's start, from a Pod and its events as the API serves them (starts/*.json,
recorded from the kubelet double, whose event messages are the kubelet's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dynrunner.controller.backends.kubernetes.progress import start_lines, started_line

STARTS = Path(__file__).parent / "starts"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((STARTS / f"{name}.json").read_text())


def test_a_start_reads_scheduled_pulling_pulled() -> None:
    start = recorded("started")
    assert start_lines(start["pod"], start["events"]) == [
        "pod scheduled on node node-a",
        "pulling image registry.example/dynrunner/executor:1.0",
        "image registry.example/dynrunner/executor:1.0 pulled in 0.401s",
    ]
    assert started_line(start["pod"]).startswith("executor started on node node-a at 20")


def test_an_image_that_cannot_be_pulled_says_so_while_it_is_retried() -> None:
    start = recorded("pull-failing")
    lines = start_lines(start["pod"], start["events"])
    assert lines[:2] == ["pod scheduled on node node-a", "pulling image registry.example/none/executor:9"]
    assert lines[2].startswith("the executor image registry.example/none/executor:9 cannot be pulled yet (")
    assert "not found" in lines[2]


def test_a_pod_waiting_for_a_node_and_one_that_cannot_mount() -> None:
    pending = {
        "spec": {},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available",
                }
            ],
        },
    }
    assert start_lines(pending, []) == ["waiting for a node: 0/3 nodes are available"]
    mounting = {"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}
    events = [{"reason": "FailedMount", "message": 'MountVolume.SetUp failed for volume "x"'}] * 2
    assert start_lines(mounting, events) == [
        "pod scheduled on node n1",
        'the Pod cannot start yet (FailedMount): MountVolume.SetUp failed for volume "x"',
    ]
    present = [{"reason": "Pulled", "message": 'Container image "img:1" already present on machine'}]
    assert start_lines(mounting, present)[1] == "image img:1 already present on node n1"


def test_the_nodes_events_wait_for_the_pod_seen_scheduled() -> None:
    """The Pod and its events come by two watches: a Pulling event may be seen before the Pod's
    node. Its line waits, so that the log never says "pulling" before "scheduled"."""
    start = recorded("started")
    unscheduled = {**start["pod"], "spec": {**start["pod"]["spec"], "nodeName": ""}}
    assert start_lines(unscheduled, start["events"]) == []
    assert start_lines(start["pod"], start["events"])[:2] == [
        "pod scheduled on node node-a",
        "pulling image registry.example/dynrunner/executor:1.0",
    ]
