"""A step's environment files, read after it ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynrunner.executor.runtime import JobRuntime, StepFiles
from dynrunner.executor.runtime.outputs import OutputLimits
from dynrunner.executor.steps.files import SUMMARY_LIMIT, read_step_files
from dynrunner.proto.assignment import ArtifactStoreOptions


@pytest.fixture
def runtime(tmp_path: Path) -> JobRuntime:
    return JobRuntime.create(
        tmp_path,
        repository="owner/repo",
        run_id="1",
        job_key="build",
        artifacts=ArtifactStoreOptions(),
        needs={},
        limits=OutputLimits(total_bytes=4096),
    )


def _write(files: StepFiles, **contents: str | bytes) -> None:
    for name, text in contents.items():
        path: Path = getattr(files, name)
        path.write_bytes(text.encode() if isinstance(text, str) else text)


def test_outputs_env_path_state(runtime: JobRuntime) -> None:
    files = runtime.step_files(0)
    _write(
        files,
        output="a=1\nmulti<<EOF\nx\ny\nEOF\n",
        env="FOO=bar\nBODY<<END\nline 1\nline 2\nEND\n",
        path="/opt/one\r\n\n/opt/two\n",
        state="pid=12\n",
    )
    found = read_step_files(runtime, files, {"legacy": "from set-output", "a": "overridden"})
    assert not found.failed and found.rows == []
    assert found.outputs == {"legacy": "from set-output", "a": "1", "multi": "x\ny"}
    assert found.env == {"FOO": "bar", "BODY": "line 1\nline 2"}
    assert found.path == ["/opt/one", "/opt/two"]
    assert found.state == {"pid": "12"}


def test_node_options_is_refused_without_failing_the_step(runtime: JobRuntime) -> None:
    files = runtime.step_files(1)
    _write(files, env="node_options=--require evil.js\nOK=1\n")
    found = read_step_files(runtime, files, {})
    assert found.env == {"OK": "1"}
    assert found.rows == ["##[error]Can't store NODE_OPTIONS output parameter using '$GITHUB_ENV' command."]
    assert not found.failed


def test_bad_files_fail_the_step_with_the_reason(runtime: JobRuntime) -> None:
    files = runtime.step_files(2)
    _write(files, output="no-equals-sign\n", env="X<<EOF\nunterminated\n")
    found = read_step_files(runtime, files, {})
    assert found.failed
    assert any("GITHUB_OUTPUT" in row and "Invalid format" in row for row in found.rows)
    assert any("GITHUB_ENV" in row and "Matching delimiter not found" in row for row in found.rows)


def test_output_limits_fail_the_step(runtime: JobRuntime) -> None:
    files = runtime.step_files(3)
    _write(files, output="big=" + "x" * 5000 + "\n")
    found = read_step_files(runtime, files, {})
    assert found.failed and "limit" in found.rows[0]
    too_long_name = read_step_files(runtime, runtime.step_files(4), {"k" * 300: "v"})
    assert too_long_name.failed and "output name" in too_long_name.rows[0]


def test_summary_is_shown_in_the_log_and_bounded(runtime: JobRuntime) -> None:
    files = runtime.step_files(5)
    _write(files, summary="# Results\n\n| a | b |\n")
    assert read_step_files(runtime, files, {}).rows == [
        "##[group]Step summary",
        "# Results",
        "",
        "| a | b |",
        "##[endgroup]",
    ]
    big = runtime.step_files(6)
    _write(big, summary="x" * (SUMMARY_LIMIT + 1))
    found = read_step_files(runtime, big, {})
    assert not found.failed
    assert found.rows == [
        "##[error]$GITHUB_STEP_SUMMARY upload aborted, supports content up to a size of 1024k, got 1024k."
    ]


def test_an_oversized_summary_is_refused_without_being_read(runtime: JobRuntime) -> None:
    """A step that dumps a big log into $GITHUB_STEP_SUMMARY must not make the
    executor hold it all: the size is known before reading."""
    import tracemalloc

    files = runtime.step_files(7)
    with files.summary.open("wb") as fp:
        fp.truncate(48 << 20)  # 48 MiB, sparse
    tracemalloc.start()
    try:
        found = read_step_files(runtime, files, {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found.rows == [
        "##[error]$GITHUB_STEP_SUMMARY upload aborted, supports content up to a size of 1024k, got 49152k."
    ]
    assert peak < 4 << 20, f"{peak / 2**20:.0f} MiB"
