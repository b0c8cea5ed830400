"""Cache grants: signed by the controller, bound to one runtime token, scoped to a repository and refs."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime

import pytest

from dynrunner.controller.cache.grants import CacheGrants, GrantError, grant_for_task, sign, token_digest, verify
from dynrunner.proto.gitea import Task

KEY = b"k" * 32
CONTEXT = {
    "repository": "Acme/App",
    "ref": "refs/pull/7/merge",
    "base_ref": "release",
    "event": {"repository": {"id": 42, "default_branch": "main"}},
}


def test_a_grant_names_the_repository_the_job_ref_and_the_refs_it_may_read_in_order() -> None:
    grant = grant_for_task(CONTEXT, runtime_token="jwt", task_id=9, expires=100, results_url="http://gitea")
    assert grant.repo == "acme/app"
    assert grant.scope == "refs/pull/7/merge"
    assert grant.reads == ("refs/pull/7/merge", "refs/heads/release", "refs/heads/main")
    assert grant.token_sha256 == token_digest("jwt")
    assert grant.repo_id == 42  # the event's repository id: Gitea's task context has no repository_id
    on_main = grant_for_task(
        {**CONTEXT, "ref": "refs/heads/main", "base_ref": ""}, runtime_token="t", task_id=1, expires=1, results_url=""
    )
    assert on_main.reads == ("refs/heads/main",)


def test_verify_accepts_only_its_own_unexpired_grants_for_their_token() -> None:
    grant = grant_for_task(CONTEXT, runtime_token="jwt", task_id=9, expires=100, results_url="")
    text = sign(grant, KEY)
    assert verify(text, KEY, token="jwt", now=99) == grant
    with pytest.raises(GrantError, match="another token"):
        verify(text, KEY, token="other", now=99)
    with pytest.raises(GrantError, match="expired"):
        verify(text, KEY, token="jwt", now=100)
    with pytest.raises(GrantError, match="not signed"):
        verify(text, b"x" * 32, token="jwt", now=99)
    prefix, payload, mac = text.split(".")
    forged = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged["repo"] = "victim/repo"
    forged_payload = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    with pytest.raises(GrantError):
        verify(f"{prefix}.{forged_payload}.{mac}", KEY, token="jwt", now=99)
    for junk in ("", "dcg1", "dcg1..", "xyz.a.b", "dcg1.%%%.abc"):
        with pytest.raises(GrantError):
            verify(junk, KEY, token="jwt", now=99)


def test_the_claimer_options_carry_a_grant_for_the_runtime_token_or_the_task_token() -> None:
    grants = CacheGrants(url="http://cache", v2=True, key=KEY)
    deadline = datetime(2030, 1, 1, tzinfo=UTC)
    task = Task(id=5, context={**CONTEXT, "gitea_runtime_token": "jwt", "token": "tt"})
    options = grants.options_for(task, gitea_url="http://gitea", deadline=deadline)
    assert (options.url, options.v2) == ("http://cache", True)
    grant = verify(options.grant, KEY, token="jwt", now=0)
    assert (grant.task_id, grant.expires, grant.results_url) == (5, int(deadline.timestamp()), "http://gitea")
    old_gitea = Task(id=6, context={**CONTEXT, "token": "tt"})  # Gitea without runtime tokens
    assert verify(grants.options_for(old_gitea, gitea_url="", deadline=deadline).grant, KEY, token="tt", now=0)
    assert grants.options_for(Task(id=7, context=CONTEXT), gitea_url="", deadline=deadline).url == ""


@pytest.mark.parametrize("repository", [{}, {"id": "42"}, {"id": True}, {"id": -1}, None])
def test_without_a_numeric_repository_id_a_grant_names_the_repository_only(repository: object) -> None:
    context = {**CONTEXT, "event": {"repository": repository}}
    assert grant_for_task(context, runtime_token="t", task_id=1, expires=1, results_url="").repo_id == 0


def test_a_grant_signed_before_repository_ids_still_verifies() -> None:
    grant = grant_for_task(CONTEXT, runtime_token="jwt", task_id=9, expires=100, results_url="")
    payload = {k: v for k, v in json.loads(base64.urlsafe_b64decode(sign(grant, KEY).split(".")[1] + "==")).items()
               if k != "repo_id"}  # fmt: skip
    text = "dcg1." + base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    mac = base64.urlsafe_b64encode(hmac.new(KEY, text.encode(), hashlib.sha256).digest()).rstrip(b"=").decode()
    assert verify(f"{text}.{mac}", KEY, token="jwt", now=99).repo_id == 0
