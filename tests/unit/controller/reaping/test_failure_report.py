"""The reaper's failure report: the executor's last output, masked as the job log is."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from urllib.parse import quote_plus

from dynrunner.controller.assignments.finalize_records import FinalizeRecord
from dynrunner.controller.backends.base import Diagnosis, FailureReason, Observation, Phase
from dynrunner.controller.reaping.reaper import failure_report, mask_secrets
from dynrunner.proto.assignment import Assignment, ClaimingRunner
from dynrunner.proto.gitea import Task

SECRET = 'pa"ss\\word-Ünïcode 42'
TOKEN = "0123456789abcdef0123456789abcdef01234567"


def assignment(**context: object) -> Assignment:
    task = Task(
        id=5,
        workflow_payload=b"name: ci\non: push\njobs:\n  b:\n    runs-on: x\n    steps:\n      - run: x\n",
        context={"job": "b", "repository": "o/r", "token": TOKEN, **context},
        secrets={"DB": SECRET, "KEY": "-----BEGIN-----\nkey-body-line\n-----END-----"},
    )
    return Assignment(
        assignment_id="a",
        claimed_at=datetime(2026, 3, 1, tzinfo=UTC),
        task=task,
        runner=ClaimingRunner(id=1, uuid="u", token="runner-token-value", name="r"),
        gitea_url="https://gitea.example.com",
        pool="p",
        backend="local",
        job_key="b",
    )


def masked(text: str, **context: object) -> str:
    return mask_secrets(text, FinalizeRecord.of(assignment(**context)).masks)


def test_secrets_are_masked_in_the_forms_they_take_on_the_way_into_a_log() -> None:
    forms = {
        "base64": base64.b64encode(SECRET.encode()).decode(),
        "basic auth": base64.b64encode(f"user:{SECRET}".encode()).decode(),
        "json": json.dumps({"password": SECRET}),
        "query": "https://h/?p=" + quote_plus(SECRET),
        "token in json": json.dumps({"t": TOKEN}),
    }
    for what, text in forms.items():
        out = masked(text)
        assert SECRET not in out and 'pa\\"ss' not in out and TOKEN not in out, what
        assert "***" in out, what
    assert base64.b64encode(SECRET.encode()).decode()[:12] not in masked(forms["base64"])


def test_every_credential_of_the_assignment_is_masked() -> None:
    text = f"{TOKEN} runner-token-value rt-jwt-value oidc-request-token key-body-line"
    out = masked(text, gitea_runtime_token="rt-jwt-value", actions_id_token_request_token="oidc-request-token")
    assert out == "*** *** *** *** ***"


def test_add_mask_values_in_the_tail_are_masked_everywhere_in_it() -> None:
    """The executor applied these to the job log; the tail quoted afterwards must not undo it,
    whichever of GitHub's spellings the step used (escapes undone, like the executor)."""
    tail = "\n".join(
        [
            "echo generated-password-1 early",
            "::add-mask::generated-password-1",
            "  ::ADD-MASK::second%25value",
            "x ##[add-mask]third%3Bvalue",
            "using generated-password-1, second%value and third;value",
            "::add-mask::multi%0Aline-two-of-it",
            "line-two-of-it",
        ]
    )
    out = masked(tail)
    for value in ("generated-password-1", "second%value", "third;value", "line-two-of-it"):
        assert value not in out
    assert out.splitlines()[4] == "using ***, *** and ***"


def test_the_report_quotes_the_masked_tail_after_the_diagnosis() -> None:
    detail = f"Traceback ...\nValueError: {base64.b64encode(SECRET.encode()).decode()}"
    obs = Observation(Phase.FAILED, Diagnosis(FailureReason.KILLED, "killed by SIGKILL", detail))
    report = failure_report(obs, FinalizeRecord.of(assignment()).masks)
    assert report.splitlines()[:3] == [
        "killed by SIGKILL [killed]",
        "last lines of the executor's output:",
        "Traceback ...",
    ]
    assert report.splitlines()[3] == "ValueError: ***"
