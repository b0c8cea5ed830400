"""The runner.v1.Task Gitea hands out: payload, `github` context, secrets, vars, needs.

Sources: Gitea `services/actions/task.go` (`buildRunnerTask`, `generateTaskContext`),
`services/actions/context.go` (`GenerateGiteaContext`, `FindTaskNeeds`),
`models/secret/secret.go` (`GetSecretsOfTask`), `services/actions/auth.go` (runtime token),
`modules/git/ref.go` (`RefName.ShortName`/`RefType`).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2

from dynrunner.doubles.gitea import runners as runner_db
from dynrunner.doubles.gitea import runs
from dynrunner.doubles.gitea.store import Row, loads
from dynrunner.doubles.gitea.tokens import runtime_token
from dynrunner.proto._gen.runner.v1 import messages_pb2 as pb

GITHUB_ACTIONS_URL = "https://github.com"


@dataclass(frozen=True, slots=True)
class Instance:
    """What a Task depends on beyond the database: the server's own settings."""

    root_url: str  # Gitea's AppURL, with its trailing slash
    default_actions_url: str  # "github" or "self" ([actions] DEFAULT_ACTIONS_URL)
    signing_secret: bytes
    runtime_token_ttl_s: int  # `gitea_runtime_token` lifetime (profiles.Profile.runtime_token_ttl_s)
    triggering_actor: bool = True  # profiles.Profile.triggering_actor


def _lower_hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)


def ref_name(ref: str) -> tuple[str, str]:
    """(short name, ref type) as `git.RefName.ShortName`/`RefType` compute them: branches and
    tags lose their prefix, `refs/pull/<n>/<x>` gives `<n>`, `refs/for/`/`refs/remotes/`
    lose theirs; the type is `branch`, `tag`, `commit` (6 to 64 lower-case hex digits) or ''."""
    short = ref
    for prefix in ("refs/heads/", "refs/tags/", "refs/remotes/"):
        if ref.startswith(prefix):
            short = ref[len(prefix) :]
            break
    else:
        rest = ref[len("refs/pull/") :]
        if ref.startswith("refs/pull/") and "/" in rest:
            short = rest[: rest.rindex("/")]
        elif ref.startswith("refs/for/"):
            short = ref[len("refs/for/") :]
    if ref.startswith("refs/heads/"):
        kind = "branch"
    elif ref.startswith("refs/tags/"):
        kind = "tag"
    elif 6 <= len(ref) <= 64 and _lower_hex(ref):
        kind = "commit"
    else:
        kind = ""
    return short, kind


def gitea_context(instance: Instance, run: Row, job: Row | None, owner: str, repo: str) -> dict[str, Any]:
    """`GenerateGiteaContext` (without `token`/`gitea_runtime_token`). Every run has its
    first attempt (G-0715 `InsertRun`), so `run_attempt` is "1" and `triggering_actor` the
    user who triggered the run (on `main`; "" in 1.24–1.26); `job` is empty at parse time."""
    event = json.loads(run["event_payload"] or "{}")
    base_ref = head_ref = ""
    ref, sha = run["ref"], run["commit_sha"]
    pull = event.get("pull_request") if isinstance(event, dict) else None
    if isinstance(pull, dict) and isinstance(pull.get("base"), dict) and isinstance(pull.get("head"), dict):
        base_ref = str(pull["base"].get("ref", ""))
        head_ref = str(pull["head"].get("ref", ""))
        if run["event"] == "pull_request_target":
            ref = "refs/heads/" + str(pull["base"].get("name") or pull["base"].get("ref", ""))
            sha = str(pull["base"].get("sha", ""))
    short, kind = ref_name(ref)
    actions_url = GITHUB_ACTIONS_URL if instance.default_actions_url != "self" else instance.root_url.rstrip("/")
    return {
        "action": "",
        "action_path": "",
        "action_ref": "",
        "action_repository": "",
        "action_status": "",
        "actor": run["trigger_user"],
        "api_url": instance.root_url + "api/v1",
        "base_ref": base_ref,
        "env": "",
        "event": event,
        "event_name": run["event"],
        "event_path": "",
        "graphql_url": "",
        "head_ref": head_ref,
        "job": job["job_id"] if job is not None else "",
        "ref": ref,
        "ref_name": short,
        "ref_protected": False,
        "ref_type": kind,
        "path": "",
        "repository": f"{owner}/{repo}",
        "repository_owner": owner,
        "repositoryUrl": f"{instance.root_url}{owner}/{repo}",
        "retention_days": "",
        "run_id": str(run["id"]),
        "run_number": str(run["idx"]),
        "run_attempt": "1",
        "secret_source": "Actions",
        "server_url": instance.root_url,
        "sha": sha,
        "triggering_actor": run["trigger_user"] if instance.triggering_actor else "",
        "workflow": run["workflow_id"],
        "workspace": "",
        "gitea_default_actions_url": actions_url,
    }


# `GiteaContext.ToGitHubContext`: what the jobparser's expressions see of `github`
_PARSE_KEYS = (
    "event",
    "event_path",
    "workflow",
    "run_id",
    "run_number",
    "actor",
    "repository",
    "event_name",
    "sha",
    "ref",
    "ref_name",
    "ref_type",
    "head_ref",
    "base_ref",
    "workspace",
    "action",
    "action_path",
    "action_ref",
    "action_repository",
    "job",
    "repository_owner",
    "retention_days",
    "server_url",
    "api_url",
    "graphql_url",
)


def parse_context(conn: sqlite3.Connection, instance: Instance, run_id: int) -> dict[str, Any]:
    """The `github` context Gitea parses a run's workflow with (`InsertRun`)."""
    run = conn.execute("SELECT * FROM run WHERE id = ?", (run_id,)).fetchone()
    owner, repo = runner_db.repository_names(conn, run["repo_id"])
    full = gitea_context(instance, run, None, owner, repo)
    return {key: full[key] for key in _PARSE_KEYS} | {"token": ""}


def secrets_of_task(run: Row, task_token: str) -> dict[str, str]:
    """`GetSecretsOfTask`: the two token secrets, plus the run's secrets unless this is a
    fork pull request (other than `pull_request_target`)."""
    secrets = {"GITHUB_TOKEN": task_token, "GITEA_TOKEN": task_token}
    if run["is_fork_pull_request"] and run["event"] != "pull_request_target":
        return secrets
    for key, value in loads(run["secrets"]).items():
        secrets[key] = value
    return secrets


def build_task(conn: sqlite3.Connection, instance: Instance, task: Row, now: int) -> pb.Task:
    job = runs.get_job(conn, task["job_id"])
    if job is None:
        raise LookupError(f"run job with id {task['job_id']}: resource does not exist")
    run = conn.execute("SELECT * FROM run WHERE id = ?", (job["run_id"],)).fetchone()
    owner, repo = runner_db.repository_names(conn, job["repo_id"])
    context = gitea_context(instance, run, job, owner, repo)
    context["token"] = task["token_plain"]
    context["gitea_runtime_token"] = runtime_token(
        instance.signing_secret,
        task_id=task["id"],
        run_id=run["id"],
        job_id=job["id"],
        now=now,
        ttl_s=instance.runtime_token_ttl_s,
    )
    struct = struct_pb2.Struct()
    struct.update(context)
    needs = {
        key: pb.TaskNeed(outputs=need.outputs, result=pb.Result.ValueType(int(need.result)))
        for key, need in runs.find_task_needs(conn, job).items()
    }
    return pb.Task(
        id=task["id"],
        workflow_payload=bytes(job["workflow_payload"]),
        context=struct,
        secrets=secrets_of_task(run, task["token_plain"]),
        vars=loads(run["vars"]),
        needs=needs,
    )
