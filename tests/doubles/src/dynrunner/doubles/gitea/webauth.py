"""Who makes a request to Gitea's web and Actions HTTP endpoints (git, artifacts).

The double has no user accounts; the credentials it knows are the ones a job holds:

* the **task token** (`GITEA_TOKEN`/`GITHUB_TOKEN`, 40 lowercase hex), accepted as a Basic
  password (`x-access-token:<token>`, what `actions/checkout` sends through
  `http.extraheader`), as a Basic user name with an empty or `x-oauth-basic` password, or as
  `Authorization: token|bearer <token>`;
* the **runtime token** (`ACTIONS_RUNTIME_TOKEN`, a JWT), accepted as a bearer token.

Either is valid only while its task runs (Gitea `GetRunningTaskByToken`, `CheckTaskIsRunning`;
the double, like Gitea main, also while it is `cancelling`). Any other credential is refused
(Gitea: "Failed to authenticate user"), even where anonymous access would have been allowed.

Sources (v1.26.1): `modules/auth/httpauth/httpauth.go` (`ParseAuthorizationHeader`: schemes
compared ignoring case), `services/auth/basic.go`, `services/auth/oauth2.go` (`parseToken`,
`userFromToken`), `services/auth/group.go`, `services/actions/auth.go` (`TokenToTaskID`),
`models/actions/task.go` (`GetRunningTaskByToken`).
"""

from __future__ import annotations

import base64
import binascii
import re
import sqlite3
from dataclasses import dataclass

from dynrunner.doubles.gitea.status import Status
from dynrunner.doubles.gitea.store import Row
from dynrunner.doubles.gitea.tokens import decode_runtime_token, token_matches

_TASK_TOKEN = re.compile(r"^[0-9a-f]{40}$")
_LIVE = (int(Status.RUNNING), int(Status.CANCELLING))


class AuthFailed(Exception):
    """Credentials were sent but name nobody (HTTP 401 "Failed to authenticate user")."""


@dataclass(frozen=True, slots=True)
class ActionsDoer:
    """Gitea's Actions user acting for one running task."""

    task_id: int
    job_id: int
    repo_id: int
    owner_id: int
    is_fork_pull_request: bool


@dataclass(frozen=True, slots=True)
class Credentials:
    basic: tuple[str, str] | None = None
    bearer: str | None = None


def parse_authorization(header: str) -> Credentials:
    """`ParseAuthorizationHeader`: exactly two fields; `basic` (any case) with base64
    `user:password`, or `token`/`bearer` (any case) with a token. Anything else is no
    credential at all."""
    parts = header.split()
    if len(parts) != 2:
        return Credentials()
    scheme, value = parts[0].lower(), parts[1]
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8", errors="replace")
        except (binascii.Error, ValueError):
            return Credentials()
        user, sep, password = decoded.partition(":")
        return Credentials(basic=(user, password)) if sep else Credentials()
    if scheme in ("token", "bearer"):
        return Credentials(bearer=value)
    return Credentials()


def running_task_by_token(conn: sqlite3.Connection, token: str, iterations: int) -> Row | None:
    """`GetRunningTaskByToken`: 40 lowercase hex, matched by its last eight characters among
    live tasks, then by the salted hash in constant time."""
    if not _TASK_TOKEN.match(token):
        return None
    candidates = conn.execute(
        f"SELECT * FROM task WHERE token_last_eight = ? AND status IN {_LIVE}", (token[-8:],)
    ).fetchall()
    for task in candidates:
        if token_matches(token, task["token_salt"], task["token_hash"], iterations):
            row: Row = task
            return row
    return None


def task_by_runtime_token(conn: sqlite3.Connection, token: str, secret: bytes, now: int) -> Row | None:
    """`TokenToTaskID` + `CheckTaskIsRunning`: a JWT signed with the instance's secret,
    inside its `nbf`/`exp` window, whose `TaskID` is live."""
    try:
        claims = decode_runtime_token(token, secret)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        return None
    exp, nbf, task_id = claims.get("exp"), claims.get("nbf"), claims.get("TaskID")
    if not isinstance(task_id, int) or (isinstance(exp, int) and now >= exp) or (isinstance(nbf, int) and now < nbf):
        return None
    row: Row | None = conn.execute(f"SELECT * FROM task WHERE id = ? AND status IN {_LIVE}", (task_id,)).fetchone()
    return row


def _doer(conn: sqlite3.Connection, task: Row) -> ActionsDoer:
    job = conn.execute("SELECT is_fork_pull_request FROM run_job WHERE id = ?", (task["job_id"],)).fetchone()
    return ActionsDoer(
        task_id=int(task["id"]),
        job_id=int(task["job_id"]),
        repo_id=int(task["repo_id"]),
        owner_id=int(task["owner_id"]),
        is_fork_pull_request=bool(job["is_fork_pull_request"]) if job else False,
    )


def web_doer(
    conn: sqlite3.Connection, authorization: str, *, iterations: int, secret: bytes, now: int
) -> ActionsDoer | None:
    """The OAuth2-then-Basic group of Gitea's git and attachment routes. None: anonymous.
    Raises AuthFailed for a credential that names nobody."""
    if not authorization:
        return None
    creds = parse_authorization(authorization)
    if creds.bearer is not None:
        token = creds.bearer
        task = (
            task_by_runtime_token(conn, token, secret, now)
            if "." in token
            else running_task_by_token(conn, token, iterations)
        )
        if task is None:
            raise AuthFailed("Failed to authenticate user")
        return _doer(conn, task)
    if creds.basic is not None:
        user, password = creds.basic
        token = user if password in ("", "x-oauth-basic") else password
        task = running_task_by_token(conn, token, iterations)
        if task is None:
            raise AuthFailed("Failed to authenticate user")  # `UserSignIn`: no such user
        return _doer(conn, task)
    return None
