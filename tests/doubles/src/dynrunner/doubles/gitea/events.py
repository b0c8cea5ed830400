"""Webhook-like event payloads for submitted runs that bring none.

Shaped after Gitea's `modules/structs` payloads (`PushPayload`, repository and user
objects) with the fields a workflow commonly reads; ids are stable fakes.
"""

from __future__ import annotations

from typing import Any


def _user(url: str, login: str) -> dict[str, Any]:
    return {"id": 1, "login": login, "username": login, "full_name": login, "html_url": f"{url}/{login}"}


def _repository(url: str, full_name: str, private: bool, default_branch: str) -> dict[str, Any]:
    owner, name = full_name.split("/", 1)
    return {
        "id": 1,
        "name": name,
        "full_name": full_name,
        "owner": _user(url, owner),
        "private": private,
        "fork": False,
        "html_url": f"{url}/{full_name}",
        "clone_url": f"{url}/{full_name}.git",
        "default_branch": default_branch,
    }


def default_event(
    url: str,
    repository: str,
    event_name: str,
    ref: str,
    sha: str,
    actor: str,
    settings: tuple[bool, str] = (False, "main"),
) -> dict[str, Any]:
    """`settings`: the repository's (private, default branch)."""
    base: dict[str, Any] = {"repository": _repository(url, repository, *settings), "sender": _user(url, actor)}
    if event_name == "push":
        return {
            "ref": ref,
            "before": "0" * 40,
            "after": sha,
            "compare_url": "",
            "commits": [],
            "total_commits": 0,
            "head_commit": None,
            "pusher": _user(url, actor),
            **base,
        }
    if event_name == "workflow_dispatch":
        return {"inputs": {}, "ref": ref, "workflow": "", **base}
    return base
