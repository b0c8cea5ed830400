"""`dynrunner-executor expr`: single expressions, `if:` conditions, and the JSON-lines batch mode."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dynrunner.executor import cli


@pytest.fixture
def context_file(tmp_path: Path) -> Path:
    path = tmp_path / "ctx.json"
    path.write_text(
        json.dumps(
            {
                "github": {"ref": "refs/heads/main", "event": {"labels": [{"name": "bug"}, {"name": "ci"}]}},
                "steps": {"build": {"outputs": {"n": "3"}}},
                "matrix": {"os": "linux"},
            }
        )
    )
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["expr", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_prints_the_value_as_json(context_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--context", str(context_file), "github.event.labels.*.name"], capsys) == (0, '["bug", "ci"]\n', "")
    assert run(["--context", str(context_file), "fromJSON(steps.build.outputs.n) + 0 == 3"], capsys)[0] == 2
    assert run(["--context", str(context_file), "fromJSON(steps.build.outputs.n)"], capsys) == (0, "3\n", "")
    assert run(["--context", str(context_file), "toJSON(matrix)"], capsys) == (
        0,
        '"{\\n  \\"os\\": \\"linux\\"\\n}"\n',
        "",
    )
    assert run(["1.5"], capsys) == (0, "1.5\n", "")
    assert run(["null"], capsys) == (0, "null\n", "")


def test_errors_exit_2_with_the_message_on_stderr(context_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--context", str(context_file), "env.PATH"], capsys)
    assert (code, out) == (2, "")
    assert err == "Unrecognized named-value: 'env'. Located at position 1 within expression: env.PATH\n"
    code, out, err = run(["--context", str(context_file), "--where", "jobs.<job_id>.if", "matrix.os"], capsys)
    assert code == 2
    assert err.startswith("Unrecognized named-value: 'matrix'")
    code, _, err = run(["--context", str(context_file / "missing"), "1"], capsys)
    assert code == 2
    assert err.startswith("Cannot read the contexts from")
    assert run([], capsys)[0] == 2


def test_if_and_status(context_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--if", "--context", str(context_file), "github.ref == 'refs/heads/main'"], capsys)[1] == "true\n"
    assert run(["--if", "--status", "failure", "1 == 1"], capsys)[1] == "false\n"
    assert run(["--if", "--status", "failure", "${{ failure() }}"], capsys)[1] == "true\n"
    assert run(["--status", "cancelled", "cancelled()"], capsys)[1] == "true\n"


def test_hash_files_uses_the_workspace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.txt").write_text("a")
    code, out, _ = run(["--workspace", str(tmp_path), "hashFiles('*.txt')"], capsys)
    assert code == 0
    assert len(json.loads(out)) == 64


def test_batch_answers_every_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    requests = [
        {"expr": "a.b", "context": {"a": {"B": 1}}},
        {"expr": "format('{0}')", "context": {}},
        "not json",
        {"expr": "failure()", "if": True, "status": "failure"},
        {"expr": "steps.x", "context": {"steps": {}}, "where": "jobs.<job_id>.if"},
        {"no": "expr"},
        {"expr": "1", "status": "done"},
        {"expr": "x", "context": {"x": [1.0, 2.5, {"k": None}]}},
    ]
    lines = [r if isinstance(r, str) else json.dumps(r) for r in requests]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n\n"))
    code, out, _ = run(["--batch"], capsys)
    assert code == 0
    answers = [json.loads(line) for line in out.splitlines()]
    assert answers == [
        {"result": 1},
        {"error": "The following format string references more arguments than were supplied: {0}"},
        {"error": answers[2]["error"]},
        {"result": True},
        {"error": "Unrecognized named-value: 'steps'. Located at position 1 within expression: steps.x"},
        {"error": 'A request is a JSON object {"expr": ..., "context": {...}}'},
        {"error": "Unknown job status 'done', expected one of success, failure, cancelled"},
        {"result": [1, 2.5, {"k": None}]},
    ]
    assert answers[2]["error"].startswith("The request is not valid JSON")


def test_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "dynrunner-executor"
    done = subprocess.run(
        [str(script), "expr", "--batch"],
        input='{"expr": "join(x, \'+\')", "context": {"x": ["a", "b"]}}\n',
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"result": "a+b"}\n'
