"""A Pod's start as stage lines for the job log, in the user's words (a pure function of the
Pod and its events): scheduled on a node, pulling the image, the image pulled and how long it
took, and what holds it up (no node fits yet, the image cannot be pulled yet, a volume cannot
be mounted yet). The launcher writes each new line while it heartbeats the task, so a user
sees why a job waits, and Gitea never reaps it as a zombie during a slow pull.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dynrunner.controller.backends.kubernetes.diagnosis import (
    START_PROBLEM_EVENTS,
    executor_status,
    service_statuses,
    waiting_line,
)

_PULLED = re.compile(r'Successfully pulled image "(?P<image>[^"]+)" in (?P<took>[0-9.hmsµun]+)')
_PRESENT = re.compile(r'Container image "(?P<image>[^"]+)" already present on machine')
_PULLING = re.compile(r'Pulling image "(?P<image>[^"]+)"')


def start_lines(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every line the start deserves so far, oldest first (the caller writes the new ones).

    `events` are the Pod's events (oldest first), as the API serves them. They are its node's
    (the kubelet's, a volume's attachment), so they wait for the Pod seen scheduled: the Pod
    and its events come by two watches, and a Pulling event seen first told "pulling image"
    before "pod scheduled on node" (under load)."""
    lines: list[str] = []
    node = (pod.get("spec") or {}).get("nodeName") or ""
    if node:
        lines.append(f"pod scheduled on node {node}")
    for event in events if node else ():
        reason, message = event.get("reason"), str(event.get("message") or "")
        if reason == "Pulling" and (match := _PULLING.search(message)):
            lines.append(f"pulling image {match['image']}")
        elif reason == "Pulled" and (match := _PULLED.search(message)):
            lines.append(f"image {match['image']} pulled in {match['took']}")
        elif reason == "Pulled" and (match := _PRESENT.search(message)):
            lines.append(f"image {match['image']} already present on node {node}")
        elif reason in START_PROBLEM_EVENTS:
            lines.append(f"the Pod cannot start yet ({reason}): {message}")
    for container, status in service_statuses(pod):
        if status.get("started") and not status.get("restartCount"):
            lines.append(f"service {container.get('name')} started")
    waiting = waiting_line(pod)
    if waiting:
        lines.append(waiting)
    return _unique(lines)


def started_line(pod: Mapping[str, Any]) -> str:
    """For a Pod whose executor runs (or ran): where, for the controller's log."""
    node = (pod.get("spec") or {}).get("nodeName") or "its node"
    state = executor_status(pod).get("state") or {}
    started = (state.get("running") or state.get("terminated") or {}).get("startedAt", "")
    return f"executor started on node {node}" + (f" at {started}" if started else "")


def _unique(lines: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for line in lines:
        if line not in seen:
            seen.add(line)
            out.append(line)
    return out
