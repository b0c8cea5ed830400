"""Bounded outputs: limits per name, per value and per job, with messages naming the output."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from dynrunner.executor.runtime.envfile import EnvFileError
from dynrunner.executor.runtime.outputs import (
    MIB,
    OutputBudget,
    OutputLimitError,
    OutputLimits,
    check_outputs,
    read_output_file,
)


def write(tmp_path: Path, data: bytes | str) -> Path:
    path = tmp_path / "output"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_reads_both_forms_and_the_last_write_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "tests=passed\nnotes<<EOF\na\nb\nEOF\ntests=failed-then-passed\n")
    assert read_output_file(path, OutputLimits()) == {"tests": "failed-then-passed", "notes": "a\nb"}


def test_a_missing_file_has_no_outputs(tmp_path: Path) -> None:
    assert read_output_file(tmp_path / "absent", OutputLimits()) == {}


def test_values_at_the_limit_pass(tmp_path: Path) -> None:
    key = "k" * 255
    path = write(tmp_path, f"{key}={'v' * MIB}\n")
    assert read_output_file(path, OutputLimits()) == {key: "v" * MIB}


def test_a_value_over_the_limit_names_the_output_and_the_limit(tmp_path: Path) -> None:
    path = write(tmp_path, "small=1\nbig=" + "x" * (2 * MIB) + "\n")
    with pytest.raises(OutputLimitError) as info:
        read_output_file(path, OutputLimits())
    assert str(info.value) == "output 'big' is 2097152 bytes; the limit for one output value is 1048576 bytes"
    assert (info.value.key, info.value.size, info.value.limit) == ("big", 2 * MIB, MIB)


def test_a_multiline_value_over_the_limit_is_measured_exactly(tmp_path: Path) -> None:
    line = "y" * 1023
    body = "\n".join([line] * 2048)  # 2048 * 1024 - 1 bytes
    path = write(tmp_path, f"log<<EOF\n{body}\nEOF\n")
    with pytest.raises(OutputLimitError, match=r"^output 'log' is 2097151 bytes; the limit for one output value"):
        read_output_file(path, OutputLimits())


def test_bytes_not_characters_are_counted(tmp_path: Path) -> None:
    path = write(tmp_path, "word=" + "ü" * 6 + "\n")  # 12 bytes
    with pytest.raises(OutputLimitError, match="output 'word' is 12 bytes; the limit for one output value is 10"):
        read_output_file(path, OutputLimits(value_bytes=10))


def test_a_name_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "n" * 256 + "=1\n")
    with pytest.raises(
        OutputLimitError, match=r"^an output name of 256 bytes was written; the limit for an output name is 255 bytes"
    ) as info:
        read_output_file(path, OutputLimits())
    assert "nnnn" not in str(info.value)  # not quoted: it may be a secret written without `name=`


def test_a_huge_value_is_counted_without_being_loaded(tmp_path: Path) -> None:
    path = tmp_path / "output"
    with path.open("wb") as fp:
        fp.write(b"dump<<EOF\n")
        for _ in range(64):
            fp.write(b"z" * (MIB - 1) + b"\n")
        fp.write(b"EOF\nafter=1\n")
    tracemalloc.start()
    try:
        with pytest.raises(OutputLimitError, match=rf"output 'dump' is {64 * MIB - 1} bytes"):
            read_output_file(path, OutputLimits())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB


def test_a_huge_single_line_is_counted_without_being_loaded(tmp_path: Path) -> None:
    path = tmp_path / "output"
    with path.open("wb") as fp:
        fp.write(b"blob=")
        for _ in range(32):
            fp.write(b"q" * MIB)
    tracemalloc.start()
    try:
        with pytest.raises(OutputLimitError, match=rf"output 'blob' is {32 * MIB} bytes"):
            read_output_file(path, OutputLimits())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB


def test_format_errors_come_through(tmp_path: Path) -> None:
    with pytest.raises(EnvFileError, match=r"Matching delimiter not found 'EOF' \(GITHUB_OUTPUT, line 1\)"):
        read_output_file(write(tmp_path, "x<<EOF\nunterminated\n"), OutputLimits())


def test_the_job_total_counts_every_step_once() -> None:
    budget = OutputBudget(OutputLimits(total_bytes=100))
    budget.record("0", {"a": "x" * 40})  # 41
    budget.record("0", {"a": "x" * 40})  # the same step again replaces its share
    budget.record("1", {"b": "y" * 40})  # 82
    assert budget.used == 82
    with pytest.raises(OutputLimitError) as info:
        budget.record("2", {"c": "1", "d": "z" * 20})
    assert str(info.value) == (
        "outputs of this job reach 105 bytes with output 'd'; the limit for all outputs of one job is 100 bytes"
    )
    assert info.value.key == "d"
    assert budget.used == 82


def test_check_outputs_applies_name_and_value_limits() -> None:
    check_outputs({"ok": "v"}, OutputLimits())
    with pytest.raises(OutputLimitError, match="output 'x' is 3 bytes"):
        check_outputs({"x": "abc"}, OutputLimits(value_bytes=2))
