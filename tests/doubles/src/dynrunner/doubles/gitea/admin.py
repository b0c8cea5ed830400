"""A small JSON admin API under `/_double/`, for `make demo` and out-of-process tests.

    GET  /_double/health                      {"ok": true, "url", "profile"}
    GET  /_double/costs                       what runner calls cost so far (costs.CostView)
    GET  /_double/registration-token          {"token": <current global token>}
    POST /_double/registration-token          {"owner"?, "repo"?} → {"token"}
    GET  /_double/runners                     [runner, ...]
    POST /_double/runs                        {"repository", "workflow" (YAML text or object),
                                               "event_name"?, "event"?, "ref"?, "sha"?,
                                               "secrets"?, "vars"?, "workflow_file"?} → run
    GET  /_double/runs                        [run, ...]
    GET  /_double/runs/<id>                   run (with its jobs)
    GET  /_double/runs/<id>/jobs              [job, ...]
    POST /_double/runs/<id>/cancel            run
    GET  /_double/tasks/<id>                  task (steps, outputs, log rows)
    POST /_double/reap-zombies                {"reaped": [task ids]}
    POST /_double/repos                       {"repository", "private"?, "default_branch"?} → repo
    GET  /_double/repos/<owner>/<name>        repo (with its branches and tags)
    POST /_double/repos/<owner>/<name>/commits
                                              {"files"?: {path: text}, "files_base64"?: {path: base64},
                                               "executable"?, "delete"?, "replace"?, "branch"?,
                                               "message"?, "tags"?} → {"sha", "branch", "tags"}

Errors: 400 {"error"} for bad input, 404 {"error"} for unknown ids, 409 for a repository
that exists already.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from typing import Any, Protocol

from dynrunner.doubles.gitea import views
from dynrunner.doubles.gitea.costs import CostView
from dynrunner.doubles.gitea.gitrepos import Commit
from dynrunner.doubles.gitea.httpio import ASGIApp, Receive, Scope, Send
from dynrunner.doubles.gitea.jobparser import WorkflowError
from dynrunner.doubles.gitea.profiles import Profile
from dynrunner.doubles.gitea.repos import RepositoryExists, RepoView
from dynrunner.doubles.gitea.views import to_dict

_SUBMIT_KEYS = ("event_name", "event", "ref", "sha", "secrets", "vars", "workflow_file", "actor")


class Administered(Protocol):
    """What the admin API calls of the double (`GiteaDouble`; its methods say what they do)."""

    url: str
    registration_token: str

    @property
    def profile(self) -> Profile: ...
    def costs(self) -> CostView: ...
    def new_registration_token(self, owner: str | None = None, repo: str | None = None) -> str: ...
    def runners(self) -> list[views.RunnerView]: ...
    def submit(
        self,
        repository: str,
        workflow: str | Mapping[str, Any] | None,
        *,
        event_name: str = ...,
        event: Mapping[str, Any] | None = ...,
        ref: str = ...,
        sha: str | None = ...,
        secrets: Mapping[str, str] | None = ...,
        vars: Mapping[str, str] | None = ...,
        workflow_file: str = ...,
        actor: str = ...,
    ) -> views.RunView: ...
    def runs(self) -> list[views.RunView]: ...
    def run(self, run_id: int) -> views.RunView: ...
    def jobs(self, run_id: int) -> list[views.JobView]: ...
    def cancel_run(self, run_id: int) -> None: ...
    def task(self, task_id: int) -> views.TaskView: ...
    def reap_zombies(self) -> list[int]: ...
    def create_repository(self, full_name: str, *, private: bool = ..., default_branch: str = ...) -> RepoView: ...
    def repository(self, full_name: str) -> RepoView: ...
    def commit(
        self,
        full_name: str,
        files: Mapping[str, str | bytes],
        *,
        branch: str | None = ...,
        message: str = ...,
        executable: Iterable[str] = ...,
        delete: Iterable[str] = ...,
        replace: bool = ...,
        tags: Iterable[str] = ...,
    ) -> Commit: ...


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def build(double: Administered, pool: Executor) -> ASGIApp:
    """The admin API of `double`; its handlers run in `pool` (they touch SQLite)."""
    routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = [
        (
            "GET",
            re.compile(r"/_double/health"),
            lambda body: {"ok": True, "url": double.url, "profile": double.profile.name},
        ),
        ("GET", re.compile(r"/_double/costs"), lambda body: to_dict(double.costs())),
        ("GET", re.compile(r"/_double/registration-token"), lambda body: {"token": double.registration_token}),
        (
            "POST",
            re.compile(r"/_double/registration-token"),
            lambda body: {"token": double.new_registration_token(owner=body.get("owner"), repo=body.get("repo"))},
        ),
        ("GET", re.compile(r"/_double/runners"), lambda body: [to_dict(r) for r in double.runners()]),
        ("POST", re.compile(r"/_double/runs"), lambda body: to_dict(_submit(double, body))),
        ("GET", re.compile(r"/_double/runs"), lambda body: [to_dict(r) for r in double.runs()]),
        ("GET", re.compile(r"/_double/runs/(\d+)"), lambda body, rid: to_dict(double.run(int(rid)))),
        ("GET", re.compile(r"/_double/runs/(\d+)/jobs"), lambda body, rid: [to_dict(j) for j in double.jobs(int(rid))]),
        ("POST", re.compile(r"/_double/runs/(\d+)/cancel"), lambda body, rid: _cancel(double, int(rid))),
        ("GET", re.compile(r"/_double/tasks/(\d+)"), lambda body, tid: to_dict(double.task(int(tid)))),
        ("POST", re.compile(r"/_double/reap-zombies"), lambda body: {"reaped": double.reap_zombies()}),
        ("POST", re.compile(r"/_double/repos"), lambda body: to_dict(_create_repository(double, body))),
        ("GET", re.compile(r"/_double/repos/([^/]+/[^/]+)"), lambda body, name: to_dict(double.repository(name))),
        ("POST", re.compile(r"/_double/repos/([^/]+/[^/]+)/commits"), lambda body, name: _commit(double, name, body)),
    ]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        status, payload = 200, None
        try:
            body = await _read_json(receive)
            handler, args = _route(routes, scope["method"], scope["path"].rstrip("/"))
            loop = asyncio.get_running_loop()
            payload = await loop.run_in_executor(pool, lambda: handler(body, *args))
        except _HTTPError as exc:
            status, payload = exc.status, {"error": str(exc)}
        except RepositoryExists as exc:
            status, payload = 409, {"error": str(exc)}
        except (WorkflowError, ValueError, TypeError) as exc:
            status, payload = 400, {"error": str(exc)}
        except KeyError as exc:
            status, payload = 404, {"error": str(exc.args[0]) if exc.args else "not found"}
        data = json.dumps(payload).encode()
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": data})

    return app


def _route(
    routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]], method: str, path: str
) -> tuple[Callable[..., Any], tuple[str, ...]]:
    allowed = False
    for verb, pattern, handler in routes:
        match = pattern.fullmatch(path)
        if match:
            if verb == method:
                return handler, match.groups()
            allowed = True
    raise _HTTPError(405 if allowed else 404, f"{method} {path} is not an admin route")


async def _read_json(receive: Receive) -> dict[str, Any]:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _HTTPError(400, f"request body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _HTTPError(400, "request body must be a JSON object")
    return data


def _submit(double: Administered, body: dict[str, Any]) -> Any:
    if "repository" not in body or "workflow" not in body:
        raise _HTTPError(400, "a run needs 'repository' and 'workflow'")
    options = {k: body[k] for k in _SUBMIT_KEYS if k in body}
    return double.submit(body["repository"], body["workflow"], **options)


def _cancel(double: Administered, run_id: int) -> Any:
    double.cancel_run(run_id)
    return to_dict(double.run(run_id))


def _create_repository(double: Administered, body: dict[str, Any]) -> RepoView:
    if not isinstance(body.get("repository"), str):
        raise _HTTPError(400, "a repository needs 'repository' (owner/name)")
    return double.create_repository(
        body["repository"], private=bool(body.get("private", False)), default_branch=body.get("default_branch", "main")
    )


def _commit(double: Administered, name: str, body: dict[str, Any]) -> dict[str, Any]:
    files: dict[str, str | bytes] = dict(body.get("files") or {})
    try:
        encoded = body.get("files_base64") or {}
        files.update({path: base64.b64decode(data, validate=True) for path, data in encoded.items()})
    except (binascii.Error, TypeError) as exc:
        raise _HTTPError(400, f"files_base64 holds something that is not base64: {exc}") from None
    commit = double.commit(
        name,
        files,
        branch=body.get("branch"),
        message=body.get("message", "commit from a test"),
        executable=body.get("executable") or (),
        delete=body.get("delete") or (),
        replace=bool(body.get("replace", False)),
        tags=body.get("tags") or (),
    )
    return {"sha": commit.sha, "branch": commit.branch, "tags": list(commit.tags)}
