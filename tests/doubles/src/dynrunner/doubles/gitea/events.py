"""Webhook-like event payloads for submitted runs that bring none.

Shaped after Gitea's `modules/structs` payloads (`PushPayload`, repository, user and commit
objects) with every key Gitea sends (compared with real 1.24.6, 1.25.5 and 1.26.4 by
tests/peers/test_gitea_contexts.py); ids, dates and counts are stable fakes.
"""

from __future__ import annotations

from typing import Any


def _user(url: str, login: str) -> dict[str, Any]:
    """`structs.User` as `convert.ToUser` gives it to a webhook (its `MarshalJSON` adds
    `username`), the same keys in 1.24, 1.25 and 1.26."""
    return {
        "id": 1,
        "login": login,
        "login_name": "",
        "source_id": 0,
        "full_name": "",
        "email": f"{login}@noreply.localhost",
        "avatar_url": f"{url}/avatars/{login}",
        "html_url": f"{url}/{login}",
        "language": "",
        "is_admin": False,
        "last_login": "0001-01-01T00:00:00Z",
        "created": EPOCH,
        "restricted": False,
        "active": False,
        "prohibit_login": False,
        "location": "",
        "website": "",
        "description": "",
        "visibility": "public",
        "followers_count": 0,
        "following_count": 0,
        "starred_repos_count": 0,
        "username": login,
    }


EPOCH = "1970-01-01T00:00:00Z"

NEWER_REPOSITORY_KEYS: dict[str, Any] = {
    "allow_manual_merge": False,
    "autodetect_manual_merge": False,
    "has_code": True,
    "branch_count": 1,
}
"""`structs.Repository` keys that releases after 1.24 added (`profiles.Profile.event_repository_keys`)."""


def _repository(
    url: str, full_name: str, private: bool, default_branch: str, newer_keys: tuple[str, ...]
) -> dict[str, Any]:
    """`structs.Repository` as `convert.ToRepo` gives it to a webhook: every key Gitea sends
    (the omitempty ones that are empty left out), with a new repository's values."""
    owner, name = full_name.split("/", 1)
    repository = {
        "id": 1,
        "owner": _user(url, owner),
        "name": name,
        "full_name": full_name,
        "description": "",
        "empty": False,
        "private": private,
        "fork": False,
        "template": False,
        "mirror": False,
        "size": 0,
        "language": "",
        "languages_url": f"{url}/api/v1/repos/{full_name}/languages",
        "html_url": f"{url}/{full_name}",
        "url": f"{url}/api/v1/repos/{full_name}",
        "link": "",
        "ssh_url": f"git@localhost:{full_name}.git",
        "clone_url": f"{url}/{full_name}.git",
        "original_url": "",
        "website": "",
        "stars_count": 0,
        "forks_count": 0,
        "watchers_count": 1,
        "open_issues_count": 0,
        "open_pr_counter": 0,
        "release_counter": 0,
        "default_branch": default_branch,
        "archived": False,
        "created_at": EPOCH,
        "updated_at": EPOCH,
        "archived_at": EPOCH,
        "permissions": {"admin": True, "push": True, "pull": True},
        "has_issues": True,
        "internal_tracker": {
            "enable_time_tracker": True,
            "allow_only_contributors_to_track_time": True,
            "enable_issue_dependencies": True,
        },
        "has_wiki": True,
        "has_pull_requests": True,
        "has_projects": True,
        "projects_mode": "all",
        "has_releases": True,
        "has_packages": True,
        "has_actions": True,
        "ignore_whitespace_conflicts": False,
        "allow_merge_commits": True,
        "allow_rebase": True,
        "allow_rebase_explicit": True,
        "allow_squash_merge": True,
        "allow_fast_forward_only_merge": True,
        "allow_rebase_update": True,
        "default_delete_branch_after_merge": False,
        "default_merge_style": "merge",
        "default_allow_maintainer_edit": True,
        "avatar_url": "",
        "internal": False,
        "mirror_interval": "",
        "object_format_name": "sha1",
        "mirror_updated": "0001-01-01T00:00:00Z",
        "topics": [],
        "licenses": [],
    }
    repository.update({key: NEWER_REPOSITORY_KEYS[key] for key in newer_keys})
    return repository


def _commit(url: str, repository: str, sha: str, actor: str) -> dict[str, Any]:
    """`structs.PayloadCommit` of the pushed commit (its message and files unknown here)."""
    who = {"name": actor, "email": f"{actor}@noreply.localhost", "username": actor}
    return {
        "id": sha,
        "message": "",
        "url": f"{url}/{repository}/commit/{sha}",
        "author": who,
        "committer": who,
        "verification": None,
        "timestamp": EPOCH,
        "added": [],
        "removed": [],
        "modified": [],
    }


def default_event(
    url: str,
    repository: str,
    event_name: str,
    ref: str,
    sha: str,
    actor: str,
    settings: tuple[bool, str] = (False, "main"),
    newer_keys: tuple[str, ...] = tuple(NEWER_REPOSITORY_KEYS),
) -> dict[str, Any]:
    """`settings`: the repository's (private, default branch); `newer_keys`: the repository
    keys of the release answered as. A push of one commit, as the contents API makes it:
    `commits` holds it, `head_commit` is it, and `total_commits` is 0, as Gitea sends it."""
    base: dict[str, Any] = {
        "repository": _repository(url, repository, *settings, newer_keys),
        "sender": _user(url, actor),
    }
    if event_name == "push":
        head = _commit(url, repository, sha, actor)
        return {
            "ref": ref,
            "before": "0" * 40,
            "after": sha,
            "compare_url": "",
            "commits": [head],
            "total_commits": 0,
            "head_commit": head,
            "pusher": _user(url, actor),
            **base,
        }
    if event_name == "workflow_dispatch":
        return {"inputs": {}, "ref": ref, "workflow": "", **base}
    return base
